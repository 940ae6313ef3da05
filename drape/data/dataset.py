"""Stage-sharded datasets: build, publish to the object store, pre-stage, load.

Layout in the object store::

    datasets/<name>/<version>/<split>/shard-NNNNN.tar
    datasets/<name>/<version>/manifest.json      (written last: its presence commits the dataset)

`<split>` is a stage or ``control`` (the fixed control set of the gates, held apart from training).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from drape import STAGES, layout
from drape.config import PipelineConfig
from drape.config.data import json_resolution
from drape.data.reader import ShardIndex
from drape.data.shards import IMAGE_FIELDS, LATENT_FIELDS, ShardWriter, verify_shard
from drape.data.synth import STAGE_BIAS, Sample, generate_split
from drape.storage.checksum import sha256_bytes, sha256_file
from drape.storage.store import ObjectStore, StorageError, redact_url

MANIFEST = layout.DATASET_MANIFEST


def dataset_prefix(config: PipelineConfig) -> str:
    """The object-store prefix of the config's dataset (`drape.layout`)."""
    return layout.dataset_prefix(config.data.name, config.data.version)


def _split_sizes(config: PipelineConfig) -> dict[str, int]:
    return {**config.data.samples_per_stage, "control": config.data.control_samples}


SPLITS = ("control", *STAGES)


def _writers_for(out_dir: Path, max_samples: int, max_bytes: int | None) -> dict[str, ShardWriter]:
    return {
        split: ShardWriter(out_dir=out_dir / split, root=out_dir, max_samples=max_samples, max_bytes=max_bytes)
        for split in SPLITS
    }


def write_dataset(
    out_dir: str | Path,
    samples: Iterable[tuple[str, Sample]],
    *,
    name: str,
    version: str,
    source: dict,
    stage_rule: dict,
    max_samples: int,
    max_bytes: int | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> dict:
    """Shard (split, sample) pairs into `out_dir`/<split>/ and write the manifest; returns it.

    Every stage and the control set must receive samples: a rule that starves one is an error.
    """
    out_dir = Path(out_dir)
    writers = _writers_for(out_dir, max_samples, max_bytes)
    try:
        for split, sample in samples:
            writers[split].write(sample)
            if progress:
                progress(split, 1)
    except BaseException:
        for writer in writers.values():
            writer.__exit__(RuntimeError, None, None)
        raise
    splits = {split: [info.to_dict() for info in writer.close()] for split, writer in writers.items()}
    empty = [split for split, shards in splits.items() if not shards]
    if empty:
        raise ValueError(f"dataset {name}/{version}: no samples for {empty} under stage rule {stage_rule}")
    manifest = {
        "name": name,
        "version": version,
        "created": datetime.now(UTC).isoformat(),
        "source": source,
        "stage_rule": stage_rule,
        "splits": splits,
        "control_set": control_set_id(splits["control"]),
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def build_dataset(config: PipelineConfig, out_dir: str | Path, progress: Callable[[str, int], None] | None = None) -> dict:
    """Generate the synthetic splits into `out_dir` as shards; returns (and writes) the manifest."""
    data = config.data

    def samples():
        for split, count in _split_sizes(config).items():
            for sample in generate_split(
                seed=config.seed,
                split=split,
                num_samples=count,
                num_identities=data.num_identities,
                num_garments=data.num_garments,
                resolution=data.resolution,
            ):
                yield split, sample

    source = {
        "generator": "drape.data.synth",
        "seed": config.seed,
        "resolution": json_resolution(data.resolution),
        "num_identities": data.num_identities,
        "num_garments": data.num_garments,
    }
    rule = {
        "rule": "generated per split",
        **{
            split: {"samples": count, **{k: list(v) for k, v in STAGE_BIAS[split].items()}}
            for split, count in _split_sizes(config).items()
        },
    }
    return write_dataset(
        out_dir,
        samples(),
        name=data.name,
        version=data.version,
        source=source,
        stage_rule=rule,
        max_samples=data.shard_max_samples,
        max_bytes=data.shard_max_bytes,
        progress=progress,
    )


def assign_splits(keys: list[str], *, control: int, weights: dict[str, float], salt: str = "") -> dict[str, str]:
    """Deterministic split of sample keys: the `control` keys of lowest hash form the control set;
    the others fall into stages by a second hash, in proportion to `weights`."""
    if any(w < 0 for w in weights.values()) or not any(weights.get(stage, 0) > 0 for stage in STAGES):
        raise ValueError(f"stage weights must be >= 0 with at least one positive, got {weights}")
    if control >= len(keys):
        raise ValueError(f"control set of {control} samples leaves nothing to train on ({len(keys)} samples in the source)")
    ranked = sorted(keys, key=lambda key: sha256_bytes(f"{salt}control:{key}".encode()))
    assignment = {key: "control" for key in ranked[:control]}
    total = sum(weights.get(stage, 0) for stage in STAGES)
    edges, running = [], 0.0
    for stage in STAGES:
        running += weights.get(stage, 0) / total
        edges.append((running, stage))
    for key in ranked[control:]:
        position = int(sha256_bytes(f"{salt}stage:{key}".encode())[:12], 16) / 16**12
        assignment[key] = next((stage for edge, stage in edges if position < edge), edges[-1][1])
    return assignment


def import_dataset(
    source_root: str | Path,
    out_dir: str | Path,
    *,
    name: str,
    version: str,
    resolution: int | tuple[int, int],
    control: int,
    weights: dict[str, float],
    max_samples: int,
    max_bytes: int | None = None,
    layout: str | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> dict:
    """Cut a VITON-HD or DressCode tree into stage shards by the hash rule of `assign_splits`."""
    from drape.data.importers import detect_layout, list_pairs, load_pair

    layout = layout or detect_layout(source_root)
    pairs = list_pairs(source_root, layout)
    assignment = assign_splits([pair["key"] for pair in pairs], control=control, weights=weights, salt=f"{name}/{version}/")
    samples = ((assignment[pair["key"]], load_pair(source_root, layout, pair, resolution)) for pair in pairs)
    rule = {"rule": "sha256 of the pair key", "control_samples": control, "weights": {s: weights.get(s, 0) for s in STAGES}}
    source = {
        "layout": layout,
        "root": str(Path(source_root).resolve()),
        "pairs": len(pairs),
        "resolution": json_resolution(resolution),
    }
    return write_dataset(
        out_dir,
        samples,
        name=name,
        version=version,
        source=source,
        stage_rule=rule,
        max_samples=max_samples,
        max_bytes=max_bytes,
        progress=progress,
    )


def control_set_id(shards: list[dict]) -> str:
    """Content hash naming the control set: its shards' hashes in order."""
    return "control-" + sha256_bytes("".join(s["sha256"] for s in shards).encode())[:16]


def manifest_hash(manifest: dict) -> str:
    return sha256_bytes(json.dumps(manifest, sort_keys=True).encode())


def publish_dataset(local_dir: str | Path, store: ObjectStore, prefix: str) -> None:
    """Upload every shard (verified), then the manifest, which commits the dataset.

    A committed dataset version is immutable: publishing over one is an error.
    """
    local_dir = Path(local_dir)
    if store.exists(f"{prefix}/{MANIFEST}"):
        raise FileExistsError(f"{store.key_url(prefix)} already exists; dataset versions are immutable, choose a new version")
    manifest = json.loads((local_dir / MANIFEST).read_text())
    for shards in manifest["splits"].values():
        for shard in shards:
            store.put_file(local_dir / shard["path"], f"{prefix}/{shard['path']}")
    store.put_file(local_dir / MANIFEST, f"{prefix}/{MANIFEST}")


class ManifestError(ValueError):
    """A dataset manifest that cannot be trusted: the message names it, the field and what was expected."""


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_dataset_manifest(manifest: object, where: str) -> dict:
    """`manifest` (read from `where`) if it is a dataset manifest whose every name and shard path
    stays inside the cache and store (`layout.safe_name`, `layout.safe_key`) and whose shard
    records are well-formed; ManifestError naming the field otherwise."""
    if not isinstance(manifest, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {type(manifest).__name__}")
    try:
        layout.safe_name(manifest.get("name"), f"{where}: name")
        layout.safe_name(manifest.get("version"), f"{where}: version")
        splits = manifest.get("splits")
        if not isinstance(splits, dict) or not splits:
            raise ManifestError(f"{where}: splits: expected an object of split name → shard list")
        for split, shards in splits.items():
            layout.safe_name(split, f"{where}: split")
            if not isinstance(shards, list):
                raise ManifestError(f"{where}: splits.{split}: expected a list of shards")
            for i, shard in enumerate(shards):
                at = f"{where}: splits.{split}[{i}]"
                if not isinstance(shard, dict):
                    raise ManifestError(f"{at}: expected an object with path, bytes, sha256, samples")
                layout.safe_key(shard.get("path"), f"{at}.path")
                if not (_count(shard.get("bytes")) and _count(shard.get("samples"))):
                    raise ManifestError(f"{at}: bytes and samples must be integers >= 0")
                if not isinstance(shard.get("sha256"), str) or not _SHA256.fullmatch(shard["sha256"]):
                    raise ManifestError(f"{at}.sha256: expected 64 lowercase hex digits")
    except layout.UnsafePathError as error:
        raise ManifestError(str(error)) from None
    return manifest


def read_manifest(store: ObjectStore, prefix: str) -> dict | None:
    """The dataset manifest under `prefix`, checked (`check_dataset_manifest`); None when absent."""
    key = f"{prefix}/{MANIFEST}"
    if not store.exists(key):
        return None
    try:
        manifest = json.loads(store.read_bytes(key))
    except (ValueError, UnicodeDecodeError) as error:
        raise ManifestError(f"{store.key_url(key)}: not JSON ({error}); the dataset manifest is damaged") from None
    return check_dataset_manifest(manifest, store.key_url(key))


class DatasetMissing(FileNotFoundError):
    """The config's dataset is not in the object store and `data.source` is 'store': nothing is
    generated under its name (a misspelt name would otherwise train on noise, and pass)."""


def _missing(config: PipelineConfig, store: ObjectStore, prefix: str) -> DatasetMissing:
    data = config.data
    return DatasetMissing(
        f"no dataset at {store.key_url(prefix)} (data.source: store): check data.name {data.name!r} and "
        f"data.version {data.version!r}, or create it: `drape data shard <VITON-HD or DressCode root> "
        f"--out {redact_url(store.url)} --name {data.name} --version {data.version}`; for the synthetic "
        "dataset, set data.source: synthetic or run `drape data synth`"
    )


def ensure_dataset(config: PipelineConfig, store: ObjectStore, progress: Callable[[str, int], None] | None = None) -> dict:
    """The dataset's manifest (a latent version, `data.latents_of`: encoded from its pixel version
    first if the store lacks it, `drape.data.encode`). A dataset the store lacks is generated and
    published only under `data.source: synthetic`; under 'store' it is `DatasetMissing`."""
    if config.data.latents_of is not None:
        from drape.data.encode import ensure_latent_dataset

        return ensure_latent_dataset(config, store, progress)
    prefix = dataset_prefix(config)
    manifest = read_manifest(store, prefix)
    if manifest is not None:
        return manifest
    if config.data.source != "synthetic":
        raise _missing(config, store, prefix)
    with tempfile.TemporaryDirectory(prefix="drape-synth-") as scratch:
        build_dataset(config, scratch, progress)
        publish_dataset(scratch, store, prefix)
    published = read_manifest(store, prefix)
    if published is None:
        raise StorageError(f"{store.key_url(prefix)}: the dataset was published but its manifest cannot be read back")
    return published


def load_split(cache_dir: str | Path, manifest: dict, split: str) -> dict:
    """All samples of a split as stacked uint8 arrays {field: (N, H, W[, C])} plus 'keys' and 'meta',
    each shard verified against the manifest's sha256 first, then read through the one reader
    (`drape.data.reader`) training uses. For small splits: the control set, tests."""
    shards = manifest["splits"][split]
    for shard in shards:
        verify_shard(Path(cache_dir) / shard["path"], sha256=shard["sha256"], size=shard["bytes"])
    index = ShardIndex([Path(cache_dir) / shard["path"] for shard in shards])
    try:
        return index.take(range(len(index)))
    finally:
        index.close()


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


def synthesize_split(config: PipelineConfig, split: str, num_samples: int) -> dict:
    """A split generated in memory (no shards), as `load_split` returns it."""
    data = config.data
    generated = generate_split(
        seed=config.seed,
        split=split,
        num_samples=num_samples,
        num_identities=data.num_identities,
        num_garments=data.num_garments,
        resolution=data.resolution,
    )
    return stack_samples(
        {"key": s.key, "meta": s.meta, **{f: np.asarray(getattr(s, f)) for f in IMAGE_FIELDS}} for s in generated
    )


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
