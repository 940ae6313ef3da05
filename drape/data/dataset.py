"""Stage-sharded datasets: build, publish to the object store, pre-stage, load.

Layout in the object store::

    datasets/<name>/<version>/<split>/shard-NNNNN.tar
    datasets/<name>/<version>/manifest.json      (written last: its presence commits the dataset)

`<split>` is a stage or ``control`` (the fixed control set of the gates, held apart from training).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from drape import STAGES
from drape.config import GatesConfig, PipelineConfig
from drape.config.data import json_resolution
from drape.data.encode import ensure_latent_dataset
from drape.data.importers import load_pair
from drape.data.manifest import (  # noqa: F401 - re-exported: callers import the dataset API from here
    MANIFEST,
    ManifestError,
    check_dataset_manifest,
    control_set_id,
    dataset_prefix,
    manifest_hash,
    publish_dataset,
    read_manifest,
)
from drape.data.partition import check_sample_count, check_split_samples
from drape.data.reader import ShardIndex, read_shard, stack_samples, to_model_inputs  # noqa: F401 - re-exported
from drape.data.shards import IMAGE_FIELDS, ShardWriter, verify_shard
from drape.data.sources import DRESSCODE_CATEGORIES, TEST_PAIRED, TEST_UNPAIRED, TRAIN, detect_layout, list_pairs, split_counts
from drape.data.synth import Sample, generate_split, stage_bias
from drape.gates.checks.control import refuse_faceless_control
from drape.storage.checksum import sha256_bytes, sha256_file
from drape.storage.store import ObjectStore, StorageError, redact_url


def _split_sizes(config: PipelineConfig) -> dict[str, int]:
    return {**config.data.synthetic.samples_per_stage, "control": config.data.control_samples}


SPLITS = ("control", *STAGES)
EVAL_SPLITS = (TEST_PAIRED, TEST_UNPAIRED)  # an imported dataset's evaluation sets (optional: synthetic has none)


def _writers_for(out_dir: Path, max_samples: int, max_bytes: int | None) -> dict[str, ShardWriter]:
    return {
        split: ShardWriter(out_dir=out_dir / split, root=out_dir, max_samples=max_samples, max_bytes=max_bytes)
        for split in (*SPLITS, *EVAL_SPLITS)
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

    Every stage and the control set must receive samples: a rule that starves one is an error; an
    unpaired sample (``meta.paired`` false: no ground truth) anywhere but test_unpaired is one too.
    The evaluation splits (`EVAL_SPLITS`) are written when they receive samples.
    """
    out_dir = Path(out_dir)
    writers = _writers_for(out_dir, max_samples, max_bytes)
    try:
        for split, sample in samples:
            if sample.meta.get("paired") is False and split != TEST_UNPAIRED:
                raise ValueError(f"{sample.key}: an unpaired pair (no ground truth) sent to {split}; it is for evaluation only")
            writers[split].write(sample)
            if progress:
                progress(split, 1)
    except BaseException:
        for writer in writers.values():
            writer.__exit__(RuntimeError, None, None)
        raise
    splits = {split: [info.to_dict() for info in writer.close()] for split, writer in writers.items()}
    for split in EVAL_SPLITS:
        if not splits[split]:  # a synthetic dataset has no evaluation splits: no empty folders either
            (out_dir / split).rmdir()
    splits = {split: shards for split, shards in splits.items() if shards or split not in EVAL_SPLITS}
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
                num_identities=data.synthetic.num_identities,
                num_garments=data.synthetic.num_garments,
                resolution=data.resolution,
                faces=data.synthetic.faces,
                marks=data.synthetic.marks,
            ):
                yield split, sample

    source = {
        "generator": "drape.data.synth",
        "seed": config.seed,
        "resolution": json_resolution(data.resolution),
        "num_identities": data.synthetic.num_identities,
        "num_garments": data.synthetic.num_garments,
        **({"faces": data.synthetic.faces} if data.synthetic.faces != "drawn" else {}),
        **({"marks": data.synthetic.marks} if data.synthetic.marks != "letters" else {}),
    }
    rule = {
        "rule": "generated per split",
        **{
            split: {"samples": count, **{k: list(v) for k, v in stage_bias(split, data.synthetic.marks).items()}}
            for split, count in _split_sizes(config).items()
        },
    }
    return write_dataset(
        out_dir,
        refuse_faceless_control(config.gates, samples()),  # refused as it is made, never at gate time
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


def control_keys(keys: list[str], count: int, salt: str = "") -> list[str]:
    """The `count` keys of lowest hash: the control set drawn from the paired test pairs."""
    if count > len(keys):
        raise ValueError(f"control set of {count} samples, but the source has {len(keys)} paired test pairs")
    return sorted(keys, key=lambda key: sha256_bytes(f"{salt}control:{key}".encode()))[:count]


def _import_samples(source_root: Path, layout: str, pairs: list[dict], assignment: dict, control: set, resolution):
    """(split, sample) of every pair: a training pair into its stage, a paired test pair into
    test_paired (and control when chosen), an unpaired one into test_unpaired only."""
    for pair in pairs:
        sample = load_pair(source_root, layout, pair, resolution)
        if pair["split"] == TRAIN:
            yield assignment[pair["key"]], sample
            continue
        if pair["key"] in control:
            yield "control", sample
        yield pair["split"], sample


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
    allow_paired_as_unpaired: bool = False,
    gates: GatesConfig | None = None,
) -> dict:
    """Cut a VITON-HD or DressCode tree along its official splits (`drape.data.sources`): its
    training pairs into stage shards by the hash rule of `assign_splits`, `control` of its paired
    test pairs into the control set, and its paired and unpaired test pairs into test_paired and
    test_unpaired (evaluation only: never a stage). An unpaired file that is a paired one is refused
    unless `allow_paired_as_unpaired`; then the manifest names it (`source.paired_as_unpaired`).
    With `gates` judging identity through a recognizer, a control target whose face it does not
    find refuses the dataset, naming the samples (`drape.gates.checks.control`)."""
    source_root = Path(source_root)
    layout = layout or detect_layout(source_root)
    pairs = list_pairs(source_root, layout, allow_paired_as_unpaired=allow_paired_as_unpaired)
    paired_files = sorted({pair["paired_file"] for pair in pairs if "paired_file" in pair})
    salt = f"{name}/{version}/"
    assignment = assign_splits([p["key"] for p in pairs if p["split"] == TRAIN], control=0, weights=weights, salt=salt)
    chosen = set(control_keys([p["key"] for p in pairs if p["split"] == TEST_PAIRED], control, salt))
    rule = {
        "rule": "official splits; training pairs to stages by sha256 of the pair key; control from the paired test pairs",
        "control_samples": control,
        "weights": {s: weights.get(s, 0) for s in STAGES},
    }
    source = {
        "layout": layout,
        "root": str(source_root.resolve()),
        "pairs": len(pairs),
        "official_splits": split_counts(pairs),
        "resolution": json_resolution(resolution),
        **(
            {"categories": sorted({p["category"] for p in pairs}, key=DRESSCODE_CATEGORIES.index)}
            if layout == "dresscode"
            else {}
        ),
        **({"paired_as_unpaired": paired_files} if paired_files else {}),
    }
    return write_dataset(
        out_dir,
        refuse_faceless_control(gates, _import_samples(source_root, layout, pairs, assignment, chosen, resolution)),
        name=name,
        version=version,
        source=source,
        stage_rule=rule,
        max_samples=max_samples,
        max_bytes=max_bytes,
        progress=progress,
    )


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
        return ensure_latent_dataset(config, store, progress, ensure_source=ensure_dataset)
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


def synthesize_split(config: PipelineConfig, split: str, num_samples: int) -> dict:
    """A split generated in memory (no shards), as `load_split` returns it."""
    data = config.data
    generated = generate_split(
        seed=config.seed,
        split=split,
        num_samples=num_samples,
        num_identities=data.synthetic.num_identities,
        num_garments=data.synthetic.num_garments,
        resolution=data.resolution,
        faces=data.synthetic.faces,
        marks=data.synthetic.marks,
    )
    return stack_samples(
        {"key": s.key, "meta": s.meta, **{f: np.asarray(getattr(s, f)) for f in IMAGE_FIELDS}} for s in generated
    )


def load_control_dir(directory: str | Path, *, judged: bool = False) -> tuple[dict, str]:
    """A control set from a dataset root (manifest.json: checked, hashes verified) or a folder of
    shards (a try-on's inputs, a shopper's photos). A manifest that is not JSON, has no control
    split or names a path outside the root is an error naming it; so is, when the set is to be
    `judged` by the gates, one of fewer samples than they need (`MIN_SAMPLES`).

    Returns (arrays as `load_split` gives them, control set id).
    """
    directory = Path(directory)
    if (directory / MANIFEST).is_file():
        where = str(directory / MANIFEST)
        try:
            manifest = check_dataset_manifest(json.loads((directory / MANIFEST).read_text()), where)
        except (ValueError, UnicodeDecodeError) as error:
            raise ManifestError(str(error) if isinstance(error, ManifestError) else f"{where}: not JSON ({error})") from None
        if "control" not in manifest["splits"] or not isinstance(manifest.get("control_set"), str):
            raise ManifestError(f"{where}: expected a control split and its control_set id; it has {sorted(manifest['splits'])}")
        if judged:
            check_split_samples(manifest["splits"]["control"], "control", where)
        return load_split(directory, manifest, "control"), manifest["control_set"]
    shards = sorted(directory.glob("*.tar")) if directory.is_dir() else []
    if not shards:
        raise FileNotFoundError(f"{directory}: expected a dataset root with {MANIFEST} or a folder of control shards (*.tar)")
    entries = [{"path": shard.name, "sha256": sha256_file(shard), "bytes": shard.stat().st_size} for shard in shards]
    arrays = load_split(directory, {"splits": {"control": entries}}, "control")
    if judged:
        check_sample_count(len(arrays["keys"]), len(entries), "control", f"the control shards in {directory}")
    return arrays, control_set_id(entries)
