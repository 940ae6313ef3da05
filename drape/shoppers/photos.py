"""A shopper's photos: shards in the control format (`drape.data.shards`), one person in several
poses, each sample the person wearing some garment with its try-on inputs.

What drape keeps to find every copy later is their digests: the sha256 of each shard file and of
each image in it (`PhotoDigests`). The synthetic generator gives such a set for any identity
(`drape shopper photos`), which the demo and the tests use.
"""

from __future__ import annotations

import shutil
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from drape.config import PipelineConfig
from drape.data.shards import ShardError, ShardWriter
from drape.shoppers import ShopperError
from drape.storage.checksum import sha256_bytes, sha256_file

PHOTO_SEED = 7_000_003  # the photos' poses and backgrounds: apart from every split's seeds


@dataclass
class PhotoDigests:
    """sha256 of every photo file and every image in them, and their sizes (a scan hashes only files of these sizes)."""

    sha256: set[str] = field(default_factory=set)
    sizes: set[int] = field(default_factory=set)

    def add(self, payload: bytes) -> None:
        self.sha256.add(sha256_bytes(payload))
        self.sizes.add(len(payload))

    def update(self, other: PhotoDigests) -> None:
        self.sha256 |= other.sha256
        self.sizes |= other.sizes

    def to_dict(self) -> dict:
        return {"sha256": sorted(self.sha256), "sizes": sorted(self.sizes)}

    @classmethod
    def from_dict(cls, payload: dict) -> PhotoDigests:
        return cls(set(payload.get("sha256", [])), {int(size) for size in payload.get("sizes", [])})


def synthetic_photos(config: PipelineConfig, *, identity: int, count: int, out: Path, first: int = 0) -> list[str]:
    """`count` photos of synthetic identity `identity` (poses, garments and backgrounds vary) as
    shards in `out`; `first` offsets the photos, so two calls give disjoint sets. Returns the keys."""
    from drape.data.synth import ARM_POSES, make_garment, make_identity, make_sample

    person, data = make_identity(config.seed, identity), config.data
    keys = []
    with ShardWriter(out_dir=out, root=out, prefix="photos", max_samples=64) as writer:
        for index in range(first, first + count):
            garment = make_garment(config.seed, (identity * 7 + index * 5) % data.synthetic.num_garments)
            seed = PHOTO_SEED + identity * 1000 + index
            sample = make_sample(config.seed, f"photo-{index:05d}", person, garment, ARM_POSES[index % 4], seed, data.resolution)
            writer.write(sample)
            keys.append(sample.key)
    return keys


def digests(directory: Path) -> PhotoDigests:
    """The digests of the photo shards in `directory`: each file's and each image's in it."""
    found = PhotoDigests()
    for shard in sorted(directory.glob("*.tar")):
        found.add(shard.read_bytes())
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                handle = tar.extractfile(member) if member.isfile() and member.name.endswith(".png") else None
                if handle is not None:
                    found.add(handle.read())
    return found


def load_photos(directory: str | Path, what: str) -> dict:
    """The photos in `directory` as stacked arrays (`drape.data.dataset.load_control_dir`); a missing
    folder or a corrupt shard is a ShopperError naming `what` and the folder."""
    from drape.data.dataset import load_control_dir

    try:
        arrays, _ = load_control_dir(directory)
    except (FileNotFoundError, ShardError, OSError, ValueError) as error:
        raise ShopperError(f"{what} {directory}: {error}") from None
    return arrays


def copy_photos(source: Path, target: Path) -> None:
    """Copy the photo shards of `source` to `target`: a temporary folder, every file verified, then renamed."""
    temporary = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    for shard in sorted(source.glob("*.tar")):
        shutil.copyfile(shard, temporary / shard.name)
        if sha256_file(temporary / shard.name) != sha256_file(shard):
            raise ShopperError(f"{shard}: the copy in {temporary} does not match (disk error?)")
    shutil.rmtree(target, ignore_errors=True)
    temporary.rename(target)


def split_holdout(arrays: dict, count: int) -> tuple[dict, dict]:
    """(training photos, the last `count` held out for the gate)."""
    total = len(arrays["keys"])

    def rows(picked: range) -> dict:
        chosen = list(picked)
        taken = {k: v[chosen] for k, v in arrays.items() if isinstance(v, np.ndarray)}
        return {**taken, "keys": [arrays["keys"][i] for i in chosen], "meta": [arrays["meta"][i] for i in chosen]}

    return rows(range(total - count)), rows(range(total - count, total))
