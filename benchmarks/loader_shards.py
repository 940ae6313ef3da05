"""Stage shards at production resolution for benchmarks/dataloader.py, written quickly.

The generator draws a 1024 px sample in ~5 s on one core, so a few distinct samples are drawn (in
parallel) and their PNG members written again under new keys until the stage holds `samples`:
decoding cost depends on the bytes, and every reader decodes every sample it yields. Two kinds:

- `synth`: the generator's try-on images (flat colours: PNG compresses them well, decoding is
  cheap);
- `noise`: uniform noise in every image (incompressible: the worst case for PNG decoding; real
  photographs lie between the two).

The tars have the exact layout `drape.data.shards.ShardWriter` writes (``<key>.<field>.png``,
``<key>.json``), so every reader reads the same files.
"""

from __future__ import annotations

import io
import json
import tarfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from drape.data.shards import IMAGE_FIELDS
from drape.storage.checksum import sha256_file


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _synth_members(args: tuple[int, int]) -> dict[str, bytes]:
    from drape.data.synth import generate_split

    seed, resolution = args
    (sample,) = generate_split(
        seed=seed, split="identity", num_samples=1, num_identities=8, num_garments=8, resolution=resolution
    )
    members = {f"{field}.png": _png(getattr(sample, field)) for field in IMAGE_FIELDS}
    return members | {"json": json.dumps(sample.meta, sort_keys=True).encode()}


def _noise_members(args: tuple[int, int]) -> dict[str, bytes]:
    seed, resolution = args
    rng = np.random.default_rng(seed)
    members = {}
    for field in IMAGE_FIELDS:
        mask = "mask" in field
        shape = (resolution, resolution) if mask else (resolution, resolution, 3)
        pixels = (rng.integers(0, 2, shape, dtype=np.uint8) * 255) if mask else rng.integers(0, 256, shape, dtype=np.uint8)
        members[f"{field}.png"] = _png(Image.fromarray(pixels))
    return members | {"json": b'{"face_box": [0, 0, 1, 1]}'}


def write_stage(
    out_dir: Path, *, kind: str, samples: int, unique: int, resolution: int = 1024, per_shard: int = 64, split: str = "identity"
) -> dict:
    """Write `samples` samples (`unique` distinct ones) as shards under `out_dir`/`split`; returns a
    manifest {"splits": {split: [shard entries]}} as `drape.data.partition.split_data` reads it."""
    make = {"synth": _synth_members, "noise": _noise_members}[kind]
    with ProcessPoolExecutor(max_workers=2) as pool:
        distinct = list(pool.map(make, [(seed, resolution) for seed in range(unique)]))
    (out_dir / split).mkdir(parents=True, exist_ok=True)
    shards = []
    for first in range(0, samples, per_shard):
        path = out_dir / split / f"shard-{len(shards):05d}.tar"
        count = min(per_shard, samples - first)
        with tarfile.open(path, "w") as tar:
            for i in range(first, first + count):
                for suffix, payload in distinct[i % unique].items():
                    info = tarfile.TarInfo(f"s{i:07d}.{suffix}")
                    info.size, info.mtime, info.mode = len(payload), 0, 0o644
                    tar.addfile(info, io.BytesIO(payload))
        shards.append(
            {"path": str(path.relative_to(out_dir)), "samples": count, "bytes": path.stat().st_size, "sha256": sha256_file(path)}
        )
    manifest = {"splits": {split: shards}}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def stage_items(stage: Path, split: str = "identity") -> list[tuple[str, str, dict[str, tuple[int, int]]]]:
    """(shard path, key, {member suffix: (offset, size)}) per sample: the inputs of a litdata conversion."""
    from drape.data.reader import ShardIndex

    manifest = json.loads((stage / "manifest.json").read_text())
    index = ShardIndex([stage / shard["path"] for shard in manifest["splits"][split]])
    items = []
    for i, key in enumerate(index.keys):
        spans = {field: tuple(int(n) for n in index.spans[i, j]) for j, field in enumerate(index.fields) if field != "meta"}
        items.append((str(index.paths[int(index.shard_of[i])]), key, spans))
    return items


def litdata_item(item: tuple[str, str, dict[str, tuple[int, int]]]) -> dict:
    """One sample as litdata stores it: the same PNG bytes, one column per image field."""
    path, key, spans = item
    with open(path, "rb") as handle:
        columns = {}
        for field, (offset, size) in spans.items():
            handle.seek(offset)
            columns[field] = handle.read(size)
    return {"key": key, **columns}
