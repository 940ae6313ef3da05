"""Stage-sharded datasets: build, publish to the object store, pre-stage, load.

Layout in the object store::

    datasets/<name>/<version>/<split>/shard-NNNNN.tar
    datasets/<name>/<version>/manifest.json      (written last: its presence commits the dataset)

`<split>` is a stage or ``control`` (the fixed control set of the gates, held apart from training).
"""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

from drape.checksum import sha256_bytes, sha256_file
from drape.config import PipelineConfig
from drape.data.shards import IMAGE_FIELDS, ShardError, ShardWriter, read_shard, verify_shard
from drape.data.synth import STAGE_BIAS, generate_split
from drape.storage import ObjectStore

MANIFEST = "manifest.json"


def dataset_prefix(config: PipelineConfig) -> str:
    return f"datasets/{config.data.name}/{config.data.version}"


def _split_sizes(config: PipelineConfig) -> dict[str, int]:
    return {**config.data.samples_per_stage, "control": config.data.control_samples}


def build_dataset(config: PipelineConfig, out_dir: str | Path, progress: Callable[[str, int], None] | None = None) -> dict:
    """Generate the synthetic splits into `out_dir` as shards; returns (and writes) the manifest."""
    out_dir, data = Path(out_dir), config.data
    splits: dict[str, list[dict]] = {}
    for split, count in _split_sizes(config).items():
        with ShardWriter(out_dir=out_dir / split, root=out_dir, max_samples=data.shard_max_samples) as writer:
            for sample in generate_split(seed=config.seed, split=split, num_samples=count, num_identities=data.num_identities,
                                         num_garments=data.num_garments, resolution=data.resolution):
                writer.write(sample)
                if progress:
                    progress(split, 1)
        splits[split] = [info.to_dict() for info in writer.shards]
    manifest = {
        "name": data.name, "version": data.version, "created": datetime.now(timezone.utc).isoformat(),
        "source": {"generator": "drape.data.synth", "seed": config.seed, "resolution": data.resolution,
                   "num_identities": data.num_identities, "num_garments": data.num_garments},
        "stage_rule": {split: {"samples": count, **{k: list(v) for k, v in STAGE_BIAS[split].items()}}
                       for split, count in _split_sizes(config).items()},
        "splits": splits,
        "control_set": control_set_id(splits["control"]),
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def control_set_id(shards: list[dict]) -> str:
    """Content hash naming the control set: its shards' hashes in order."""
    return "control-" + sha256_bytes("".join(s["sha256"] for s in shards).encode())[:16]


def manifest_hash(manifest: dict) -> str:
    return sha256_bytes(json.dumps(manifest, sort_keys=True).encode())


def publish_dataset(local_dir: str | Path, store: ObjectStore, prefix: str) -> None:
    """Upload every shard (verified), then the manifest, which commits the dataset."""
    local_dir = Path(local_dir)
    manifest = json.loads((local_dir / MANIFEST).read_text())
    for shards in manifest["splits"].values():
        for shard in shards:
            store.put_file(local_dir / shard["path"], f"{prefix}/{shard['path']}")
    store.put_file(local_dir / MANIFEST, f"{prefix}/{MANIFEST}")


def read_manifest(store: ObjectStore, prefix: str) -> dict | None:
    if not store.exists(f"{prefix}/{MANIFEST}"):
        return None
    return json.loads(store.read_bytes(f"{prefix}/{MANIFEST}"))


def ensure_dataset(config: PipelineConfig, store: ObjectStore, progress: Callable[[str, int], None] | None = None) -> dict:
    """The dataset's manifest, generating and publishing the dataset first if the store lacks it."""
    prefix = dataset_prefix(config)
    manifest = read_manifest(store, prefix)
    if manifest is not None:
        return manifest
    with tempfile.TemporaryDirectory(prefix="drape-synth-") as scratch:
        build_dataset(config, scratch, progress)
        publish_dataset(scratch, store, prefix)
    return read_manifest(store, prefix)


def stage_split(store: ObjectStore, prefix: str, manifest: dict, split: str, cache_dir: str | Path) -> list[Path]:
    """Copy a split's shards into `cache_dir`, verified; shards already there and intact are kept."""
    local_paths = []
    for shard in manifest["splits"][split]:
        local = Path(cache_dir) / shard["path"]
        try:
            verify_shard(local, sha256=shard["sha256"], size=shard["bytes"])
        except ShardError:
            store.get_file(f"{prefix}/{shard['path']}", local, sha256=shard["sha256"])
        local_paths.append(local)
    return local_paths


def load_split(cache_dir: str | Path, manifest: dict, split: str) -> dict:
    """All samples of a split as stacked uint8 arrays {field: (N, H, W[, C])} plus 'keys' and 'meta'."""
    return stack_samples(sample for shard in manifest["splits"][split]
                         for sample in read_shard(Path(cache_dir) / shard["path"], sha256=shard["sha256"], size=shard["bytes"]))


def stack_samples(samples) -> dict:
    """Decoded samples ({key, meta, image fields}) → {field: stacked array, 'keys': [...], 'meta': [...]}."""
    columns: dict[str, list] = {field: [] for field in (*IMAGE_FIELDS, "meta")}
    keys = []
    for sample in samples:
        keys.append(sample["key"])
        for field in columns:
            columns[field].append(sample[field])
    arrays = {field: np.stack(values) for field, values in columns.items() if field != "meta"}
    return {**arrays, "keys": keys, "meta": columns["meta"]}


def synthesize_split(config: PipelineConfig, split: str, num_samples: int) -> dict:
    """A split generated in memory (no shards), as `load_split` returns it."""
    data = config.data
    generated = generate_split(seed=config.seed, split=split, num_samples=num_samples, num_identities=data.num_identities,
                               num_garments=data.num_garments, resolution=data.resolution)
    return stack_samples({"key": s.key, "meta": s.meta, **{f: np.asarray(getattr(s, f)) for f in IMAGE_FIELDS}}
                         for s in generated)


def load_control_dir(directory: str | Path) -> tuple[dict, str]:
    """A control set from a dataset root (manifest.json: hashes verified) or a folder of shards.

    Returns (arrays as `load_split` gives them, control set id).
    """
    directory = Path(directory)
    if (directory / MANIFEST).is_file():
        manifest = json.loads((directory / MANIFEST).read_text())
        return load_split(directory, manifest, "control"), manifest["control_set"]
    shards = sorted(directory.glob("*.tar")) if directory.is_dir() else []
    if not shards:
        raise FileNotFoundError(f"{directory}: expected a dataset root with {MANIFEST} or a folder of control shards (*.tar)")
    entries = [{"path": shard.name, "sha256": sha256_file(shard), "bytes": shard.stat().st_size} for shard in shards]
    return load_split(directory, {"splits": {"control": entries}}, "control"), control_set_id(entries)


def to_model_inputs(arrays: dict, indices=None) -> dict:
    """uint8 arrays → float tensors the model takes: images in [-1, 1] (N, 3, H, W), mask in [0, 1]."""
    import torch

    pick = (lambda a: a) if indices is None else (lambda a: a[indices])
    inputs = {name: torch.from_numpy(pick(arrays[name])).permute(0, 3, 1, 2).float() / 127.5 - 1
              for name in ("target", "agnostic", "pose", "garment")}
    inputs["mask"] = torch.from_numpy(pick(arrays["mask"])).float()[:, None] / 255.0
    return inputs
