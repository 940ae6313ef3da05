"""Samples decoded on demand from local shards: an index of member offsets, one sample at a time.

`ShardIndex` walks the tar headers of a rank's local shards once (no decoding) and keeps, per
sample, where each of its members lies: a few integers per sample in numpy arrays, so holding the
index of a stage costs kilobytes where decoded samples cost tens of megabytes each at 1024 px.
`take(indices)` reads just those samples' members (`os.pread`: safe from several threads) and
decodes them, in the order the index was built: shard order, then the order in which each key
first appears in its tar, the order `read_shard` yields. So a batch drawn from an index is the
batch drawn from the same samples held in memory.

The shards must stay where they are while an index reads them: the trainer holds the split pinned
in the shard cache (`ShardCache.pin`) for as long as it trains.

An index holds one kind of shard: pixels (PNG image fields) or latents (`drape data encode`:
float16 ``.npy`` fields); `kind` says which, and `model_fields` what the model reads of it. A
pixel sample may also carry the conditioning its public dataset ships (`CONDITION_FIELDS`: label
map, DensePose, skeleton, agnostic mask); `conditions` names those every sample of the index has,
read only when asked for by name.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from drape.data.shards import (
    CONDITION_FIELDS,
    IMAGE_FIELDS,
    LATENT_FIELDS,
    MODEL_FIELDS,
    ShardError,
    check_member,
    decode_member,
    verify_shard,
)

FIELDS = (*IMAGE_FIELDS, *LATENT_FIELDS, "meta", *CONDITION_FIELDS)  # "meta" is the <key>.json member
_MEMBER_FIELD = {f"{field}.png": field for field in (*IMAGE_FIELDS, *CONDITION_FIELDS)}
_MEMBER_FIELD |= {f"{f}.npy": f for f in LATENT_FIELDS} | {"json": "meta"}
# per kind of shard: the fields each of its samples has, and what the model reads of them
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "pixels": ((*IMAGE_FIELDS, "meta"), MODEL_FIELDS),
    "latents": ((*LATENT_FIELDS, "meta"), LATENT_FIELDS),
}


def _kind_of(path: Path, key: str, row: np.ndarray) -> str:
    present = {field for field, (offset, _) in zip(FIELDS, row) if offset >= 0} - set(CONDITION_FIELDS)
    for kind, (fields, _) in KINDS.items():
        if present == set(fields):
            return kind
    nearest = min(KINDS, key=lambda kind: len(present.symmetric_difference(KINDS[kind][0])))
    missing = [field for field in KINDS[nearest][0] if field not in present]
    extra = [field for field in FIELDS if field in present and field not in KINDS[nearest][0]]
    also = f" and has {extra}" if extra else ""
    raise ShardError(f"shard {path}: sample {key!r} lacks {missing} of a {nearest} sample{also}")


def _scan(path: Path) -> tuple[list[str], np.ndarray, str]:
    """The keys of one shard, in first-appearance order, (keys, fields, 2) offsets and sizes, and
    the shard's kind (every sample must be of it)."""
    spans: dict[str, np.ndarray] = {}
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                check_member(path, member)
                key, _, suffix = member.name.partition(".")
                field = _MEMBER_FIELD.get(suffix)
                if field is None:
                    raise ShardError(f"shard {path}: member {member.name!r} is not one of {sorted(_MEMBER_FIELD)}")
                row = spans.setdefault(key, np.full((len(FIELDS), 2), -1, dtype=np.int64))
                row[FIELDS.index(field)] = (member.offset_data, member.size)
    except (tarfile.TarError, EOFError, OSError) as error:
        raise ShardError(f"shard {path}: not a readable tar ({error})") from None
    kinds = {_kind_of(path, key, row) for key, row in spans.items()}
    if len(kinds) > 1:
        raise ShardError(f"shard {path}: mixes {sorted(kinds)} samples (a shard holds one kind)")
    keys = list(spans)
    table = np.stack([spans[key] for key in keys]) if keys else np.zeros((0, len(FIELDS), 2), dtype=np.int64)
    return keys, table, kinds.pop() if kinds else "pixels"


class ShardIndex:
    """Random access to the samples of some local shards, in shard order."""

    def __init__(self, paths: list[Path]):
        self._files: dict[int, int] = {}  # shard number → open file descriptor
        self.paths = [Path(p) for p in paths]
        keys, spans, shard_of, kinds = [], [], [], set()
        for number, path in enumerate(self.paths):
            shard_keys, shard_spans, kind = _scan(path)
            if shard_keys:
                kinds.add(kind)
            keys += shard_keys
            spans.append(shard_spans)
            shard_of.append(np.full(len(shard_keys), number, dtype=np.int32))
        self.keys = keys
        self.spans = np.concatenate(spans) if spans else np.zeros((0, len(FIELDS), 2), dtype=np.int64)
        self.shard_of = np.concatenate(shard_of) if shard_of else np.zeros(0, dtype=np.int32)
        if len(kinds) > 1:
            raise ShardError(f"shards {[str(p) for p in self.paths[:3]]}...: mix {sorted(kinds)} (one split holds one kind)")
        self.kind = kinds.pop() if kinds else "pixels"
        self.fields, self.model_fields = KINDS[self.kind]
        # the conditioning every sample carries (`CONDITION_FIELDS`): read when asked for by name
        held = [f for f in CONDITION_FIELDS if len(self.keys) and (self.spans[:, FIELDS.index(f), 0] >= 0).all()]
        self.conditions = tuple(held) if self.kind == "pixels" else ()
        self._columns = (*self.fields, *self.conditions)
        self.spans = self.spans[:, [FIELDS.index(field) for field in self._columns]]  # the kind's columns only

    def __len__(self) -> int:
        return len(self.keys)

    def _descriptor(self, shard: int) -> int:
        if shard not in self._files:
            self._files[shard] = os.open(self.paths[shard], os.O_RDONLY)
        return self._files[shard]

    def _span(self, index: int, fields: tuple[str, ...]) -> tuple[int, int]:
        """(first byte, end) of `fields`' members of sample `index` (adjacent in its tar)."""
        spans = self.spans[index, [self._columns.index(field) for field in fields]]
        return int(spans[:, 0].min()), int((spans[:, 0] + spans[:, 1]).max())

    def prefetch(self, indices, fields: tuple[str, ...] | None = None) -> None:
        """Ask the kernel to start reading these samples' bytes (`posix_fadvise` WILLNEED): a
        batch's later rows come off the disk while its first ones decode."""
        fields = fields or self.fields
        for index in indices:
            start, end = self._span(int(index), fields)
            os.posix_fadvise(self._descriptor(int(self.shard_of[index])), start, end - start, os.POSIX_FADV_WILLNEED)

    def sample(self, index: int, fields: tuple[str, ...] | None = None) -> dict:
        """One decoded sample {key, <fields>} (default: all of them): image fields as uint8 arrays,
        latent fields as float16 arrays, "meta" as a dict.

        A sample's members lie next to each other in its tar, so they are read in one `pread`
        (one request to the disk, not one per member)."""
        fields = fields or self.fields
        shard, key = int(self.shard_of[index]), self.keys[index]
        path, descriptor = self.paths[shard], self._descriptor(shard)
        start, end = self._span(index, fields)
        block = os.pread(descriptor, end - start, start)
        sample: dict = {"key": key}
        for field in fields:
            offset, size = (int(n) for n in self.spans[index, self._columns.index(field)])
            payload = block[offset - start : offset - start + size]
            member = f"{key}.{'json' if field == 'meta' else field + ('.npy' if field in LATENT_FIELDS else '.png')}"
            if len(payload) != size:
                raise ShardError(f"shard {path}: member {member} is cut short ({len(payload)} of {size} bytes)")
            sample[field] = decode_member(path, member, payload)
        return sample

    def take(self, indices, fields: tuple[str, ...] | None = None) -> dict:
        """The samples at `indices`, stacked as `stack_samples` stacks them (only `fields` decoded)."""
        fields = fields or self.fields
        return stack_samples((self.sample(int(i), fields) for i in indices), fields)

    def close(self) -> None:
        for descriptor in self._files.values():
            os.close(descriptor)
        self._files.clear()

    def __getstate__(self) -> dict:  # worker processes open their own descriptors
        return {**self.__dict__, "_files": {}}

    def __del__(self) -> None:
        self.close()


def stack_samples(samples, fields: tuple[str, ...] = (*IMAGE_FIELDS, "meta")) -> dict:
    """Decoded samples ({key, meta, image fields}) → {field: stacked array, 'keys': [...], 'meta': [...]}
    (of `fields`; 'meta' stays a list)."""
    columns: dict[str, list] = {field: [] for field in fields}
    keys = []
    for sample in samples:
        keys.append(sample["key"])
        for field in columns:
            columns[field].append(sample[field])
    stacked = {field: np.stack(values) for field, values in columns.items() if field != "meta"}
    return {**stacked, "keys": keys, **({"meta": columns["meta"]} if "meta" in columns else {})}


def read_shard(path: str | Path, *, sha256: str | None = None, size: int | None = None) -> Iterator[dict]:
    """Yield samples {key, meta, <image fields as uint8 arrays>}; verifies the hash first if given.
    Read through the shard index, the one reader training uses too."""
    path = Path(path)
    if sha256 is not None:
        verify_shard(path, sha256=sha256, size=size)
    index = ShardIndex([path])
    try:
        for position in range(len(index)):
            yield index.sample(position)
    finally:
        index.close()


def to_model_inputs(arrays: dict) -> dict:
    """uint8 images (numpy arrays, or tensors on any device) → float tensors the model takes, on
    the same device: images in [-1, 1] (N, 3, H, W), mask in [0, 1] (N, 1, H, W). Latent fields
    (a latent dataset's float16 arrays) → float32 tensors, as the VAE encoded them."""
    import torch

    if LATENT_FIELDS[0] in arrays:
        return {name: torch.as_tensor(arrays[name]).float() for name in LATENT_FIELDS}

    inputs = {
        name: torch.as_tensor(arrays[name]).permute(0, 3, 1, 2).float() / 127.5 - 1
        for name in ("target", "agnostic", "pose", "garment")
    }
    inputs["mask"] = torch.as_tensor(arrays["mask"]).float()[:, None] / 255.0
    return inputs
