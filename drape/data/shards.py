"""WebDataset-style tar shards with a sha256 on every shard.

A shard is a plain tar of members named ``<key>.<field>.png`` and ``<key>.json``; samples are
grouped by key in order. A latent shard (`drape data encode`) holds ``<key>.<field>.npy`` members
instead: a VAE's latents of the image fields as float16 arrays (numpy's format, never pickles).
`ShardWriter` is keyword-only, writes each shard to a temporary name, hashes it and only then
renames it into place, so a reader never sees half a shard. The reader verifies the hash before it
decodes anything and names the shard in every error.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from drape.storage.checksum import sha256_file

Image.preinit()  # PNG's decoder loaded once here, not in every decoding worker on its first sample

IMAGE_FIELDS = ("target", "agnostic", "mask", "pose", "garment", "garment_mask")
MODEL_FIELDS = ("target", "agnostic", "mask", "pose", "garment")  # what the model reads of a pixel sample
# conditioning a public dataset ships, carried where present (optional members of a pixel sample):
# label map (parse, labels as grey levels), DensePose, rendered skeleton, the dataset's own agnostic mask
CONDITION_FIELDS = ("parse", "densepose", "skeleton", "agnostic_mask")
# what a latent model reads of a latent sample: the four images encoded, the mask pooled to the latent grid
LATENT_FIELDS = ("target_latent", "agnostic_latent", "mask_latent", "pose_latent", "garment_latent")


class ShardError(ValueError):
    """A shard that is missing, corrupt, truncated or malformed; names the shard."""


@dataclass(frozen=True)
class ShardInfo:
    path: str  # relative to the dataset root
    samples: int
    bytes: int
    sha256: str

    def to_dict(self) -> dict:
        return asdict(self)


def _png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array, dtype=np.float16), allow_pickle=False)
    return buffer.getvalue()


def _add_member(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(payload), 0, 0o644
    tar.addfile(info, io.BytesIO(payload))


class ShardWriter:
    """Writes samples into ``<out_dir>/<prefix>-NNNNN.tar`` shards of at most `max_samples` samples.

    With `max_bytes` a shard also closes once it reaches that size (so it exceeds it by at most one sample).
    """

    def __init__(
        self, *, out_dir: str | Path, root: str | Path, prefix: str = "shard", max_samples: int = 64, max_bytes: int | None = None
    ):
        self.out_dir, self.root = Path(out_dir), Path(root)
        self.prefix, self.max_samples, self.max_bytes = prefix, max_samples, max_bytes
        self.shards: list[ShardInfo] = []
        self._tar: tarfile.TarFile | None = None
        self._count = 0
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def _final_path(self) -> Path:
        return self.out_dir / f"{self.prefix}-{len(self.shards):05d}.tar"

    def write(self, sample) -> None:
        """Add one `drape.data.synth.Sample` (or anything with .key, the image fields and .meta)."""
        members = {f"{field}.png": _png_bytes(getattr(sample, field)) for field in IMAGE_FIELDS}
        conditions = getattr(sample, "conditions", None) or {}
        unknown = sorted(set(conditions) - set(CONDITION_FIELDS))
        if unknown:
            raise ValueError(f"sample {sample.key!r}: conditions {unknown} are not among {CONDITION_FIELDS}")
        members |= {f"{name}.png": _png_bytes(image) for name, image in conditions.items()}
        self._write(sample.key, members, sample.meta)

    def write_latents(self, key: str, latents: dict[str, np.ndarray], meta: dict) -> None:
        """Add one latent sample: each of `LATENT_FIELDS` as a float16 ``.npy`` member."""
        missing = sorted(set(LATENT_FIELDS) - set(latents))
        if missing:
            raise ValueError(f"latent sample {key!r} lacks {missing}")
        self._write(key, {f"{field}.npy": _npy_bytes(latents[field]) for field in LATENT_FIELDS}, meta)

    def _write(self, key: str, members: dict[str, bytes], meta: dict) -> None:
        if self._tar is None:
            self._tar = tarfile.open(self._final_path().with_suffix(".tar.tmp"), "w")
        for suffix, payload in members.items():
            _add_member(self._tar, f"{key}.{suffix}", payload)
        _add_member(self._tar, f"{key}.json", json.dumps(meta, sort_keys=True).encode())
        self._count += 1
        if self._count >= self.max_samples or (self.max_bytes and self._tar.fileobj.tell() >= self.max_bytes):
            self._finish_shard()

    def _finish_shard(self) -> None:
        assert self._tar is not None, "a shard is open"
        self._tar.close()
        final = self._final_path()
        temporary = final.with_suffix(".tar.tmp")
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        info = ShardInfo(str(final.relative_to(self.root)), self._count, temporary.stat().st_size, sha256_file(temporary))
        os.replace(temporary, final)
        self.shards.append(info)
        self._tar, self._count = None, 0

    def close(self) -> list[ShardInfo]:
        """Finish the open shard; returns every shard written."""
        if self._tar is not None:
            self._finish_shard()
        return self.shards

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        elif self._tar is not None:
            self._tar.close()
            self._final_path().with_suffix(".tar.tmp").unlink(missing_ok=True)


def verify_shard(path: str | Path, *, sha256: str, size: int | None = None) -> None:
    """Raise ShardError unless the file exists with the expected size and sha256."""
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"shard {path}: missing")
    if size is not None and path.stat().st_size != size:
        raise ShardError(f"shard {path}: expected {size} bytes, found {path.stat().st_size} (truncated or replaced?)")
    actual = sha256_file(path)
    if actual != sha256:
        raise ShardError(f"shard {path}: sha256 mismatch: manifest says {sha256}, file has {actual}")


def decode_member(shard: Path, name: str, payload: bytes):
    try:
        if name.endswith(".json"):
            return json.loads(payload)
        if name.endswith(".npy"):
            return np.load(io.BytesIO(payload), allow_pickle=False)
        with Image.open(io.BytesIO(payload)) as image:
            mode = "L" if ("mask" in name or name.endswith(".parse.png")) else "RGB"
            return np.asarray(image if image.mode == mode else image.convert(mode))
    except Exception as error:  # noqa: BLE001 - any decoder failure is the shard's fault
        raise ShardError(f"shard {shard}: member {name!r} cannot be decoded: {error}") from None


_MEMBER_TYPES = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.DIRTYPE: "directory",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "fifo",
}


def check_member(shard: Path, member: tarfile.TarInfo) -> None:
    """Only flat regular files named ``<key>.<field>``: nothing that could land outside the cache."""
    name = member.name
    if name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/") or "/" in name or "\\" in name:
        raise ShardError(f"shard {shard}: member {name!r} escapes the shard directory (expected flat names <key>.<field>)")
    if not member.isfile():
        kind = _MEMBER_TYPES.get(member.type, f"type {member.type!r}")
        raise ShardError(f"shard {shard}: member {name!r} is a {kind}; only regular files are accepted")
    if name.startswith(".") or "." not in name:
        raise ShardError(f"shard {shard}: member {name!r} is not named <key>.<field>")


def check_structure(path: str | Path) -> int:
    """Walk the tar headers (no decoding): reject truncation and unsafe members; returns the member count."""
    path = Path(path)
    size, count = path.stat().st_size, 0
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                check_member(path, member)
                if member.offset_data + member.size > size:
                    raise ShardError(
                        f"shard {path}: truncated: member {member.name!r} needs "
                        f"{member.offset_data + member.size} bytes, the file has {size}"
                    )
                count += 1
    except (tarfile.TarError, EOFError) as error:
        raise ShardError(f"shard {path}: not a readable tar ({error})") from None
    if count == 0:
        raise ShardError(f"shard {path}: empty (no members)")
    return count
