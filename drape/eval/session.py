"""What `drape eval` wires together: the model version, the split from the object store (through
the node's shard cache), the feature networks, the run, and its record in MLflow.

Splits: ``test`` is the dataset's official test split in the mode asked for (``test_paired`` or
``test_unpaired``, `drape.data.sources`); ``control`` is the gates' control set (paired only: a
synthetic dataset has no official test split, its control set is its held-out set).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from drape.config import PipelineConfig
from drape.data.cache import ShardCache
from drape.data.manifest import dataset_prefix, read_manifest
from drape.data.reader import ShardIndex
from drape.data.sources import TEST_PAIRED, TEST_UNPAIRED
from drape.eval.features import FeatureNetworks, load_feature_networks
from drape.eval.runner import Progress, build_protocol, evaluate
from drape.layout import LiveLayout, live_root

MODES = ("paired", "unpaired")
SPLITS = ("test", "control")


class EvalInputError(ValueError):
    """A model version, split or mode that cannot be evaluated; names it and what was expected."""


def dataset_split(split: str, mode: str) -> str:
    """The dataset split `drape eval --split SPLIT --mode MODE` reads."""
    if mode not in MODES:
        raise EvalInputError(f"--mode {mode!r}: expected one of {MODES}")
    if split == "test":
        return TEST_PAIRED if mode == "paired" else TEST_UNPAIRED
    if split == "control" and mode == "paired":
        return "control"
    raise EvalInputError(f"--split {split!r} --mode {mode!r}: expected --split test (paired|unpaired) or control (paired)")


def open_split(config: PipelineConfig, split: str) -> tuple[ShardIndex, dict]:
    """An index over the dataset's `split`, pre-staged (verified) into the node's shard cache, and
    the dataset's manifest."""
    from drape.storage.store import open_store

    store = open_store(config)
    prefix = dataset_prefix(config)
    manifest = read_manifest(store, prefix)
    if manifest is None:
        raise EvalInputError(f"no dataset at {store.key_url(prefix)}; import one with `drape data shard`")
    if split not in manifest["splits"]:
        raise EvalInputError(
            f"dataset {config.data.name}/{config.data.version} has no {split} split (it has {sorted(manifest['splits'])}); "
            "the official test splits come with `drape data shard <VITON-HD or DressCode root>`"
        )
    cache = ShardCache.from_config(config, store, prefix, manifest)
    cache.prestage(split)
    return ShardIndex([cache.dataset_dir / shard["path"] for shard in manifest["splits"][split]]), manifest


def source_manifest(config: PipelineConfig, manifest: dict) -> dict:
    """The manifest that says what a dataset was made from: its own, or for a latent version
    (`drape data encode`, kind "latents") the pixel version's it was encoded from, so a VITON-HD
    import evaluated through its latents is still VITON-HD to the protocol."""
    from drape.data.encode import LATENTS, source_config

    if manifest.get("kind") != LATENTS:
        return manifest
    from drape.storage.store import open_store

    return read_manifest(open_store(config), dataset_prefix(source_config(config))) or manifest


def dataset_source(manifest: dict) -> str:
    """What a dataset was made from, as the protocol names it: 'VITON-HD', 'DressCode (<its
    categories>)', 'synthetic', or 'unknown' (a latent version, or a manifest that does not say);
    marked when its unpaired split came from a paired file (`--allow-paired-as-unpaired`), so it
    matches no published unpaired protocol."""
    source = manifest.get("source")
    if not isinstance(source, dict):
        return "unknown"
    paired = source.get("paired_as_unpaired")
    marked = f" [unpaired split from paired files: {', '.join(map(str, paired))}]" if isinstance(paired, list) and paired else ""
    if source.get("layout") == "viton-hd":
        return "VITON-HD" + marked
    if source.get("layout") == "dresscode":
        categories = source.get("categories")
        if isinstance(categories, list) and categories and all(isinstance(c, str) for c in categories):
            return f"DressCode ({', '.join(categories)})" + marked
        return "DressCode (categories not recorded)" + marked
    return "synthetic" if "generator" in source else "unknown"


def resolve_version(config: PipelineConfig, version: str):
    """A registry version number, an alias or a checkpoint directory → `ResolvedModel`."""
    from drape.inference.source import InferenceInputError, ResolvedModel, resolve_model

    if not version.isdigit():
        try:
            return resolve_model(config, version)
        except InferenceInputError as error:
            raise EvalInputError(str(error)) from None
    from drape.inference.source import _verified
    from drape.ops.tracking import Tracker

    tracker = Tracker(config)
    found = tracker.client.get_model_version(tracker.model_name, version)
    target = LiveLayout(live_root(config)).model_version(version)
    if not (target / "checkpoint").is_dir():
        temporary = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(temporary, ignore_errors=True)
        tracker.download(f"{found.source}/checkpoint", temporary)
        _verified(temporary / "checkpoint", f"version {version}")
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary.rename(target)
    _verified(target / "checkpoint", f"version {version}")
    return ResolvedModel(target / "checkpoint", f"v{version}", target, None, version)


def run_eval(
    config: PipelineConfig,
    *,
    version: str,
    split: str,
    mode: str,
    networks: FeatureNetworks | None = None,
    progress: Progress | None = None,
) -> dict:
    """Evaluate model `version` on `split` in `mode`; logs to MLflow. `networks`: default from
    `config.eval` (a test passes its own, built the same way)."""
    from drape.training.checkpoints.checkpoint import load_model
    from drape.training.loop.trainer import resolve_device
    from drape.training.recipes.model import configured_class_path

    stored = dataset_split(split, mode)
    resolved = resolve_version(config, version)
    networks = networks or load_feature_networks(config.eval, paired=mode == "paired")
    device = resolve_device(config.train.device)
    model = load_model(resolved.checkpoint, prefer_ema=True, allowed=(configured_class_path(config),)).to(device)  # type: ignore[arg-type]
    index, manifest = open_split(config, stored)
    try:
        total = min(len(index), config.eval.num_samples or len(index))
        dataset = f"{config.data.name}/{config.data.version}"
        protocol = build_protocol(
            config,
            dataset=dataset,
            source=dataset_source(source_manifest(config, manifest)),
            split=stored,
            mode=mode,
            num_samples=total,
            model=resolved.label,
        )
        out_dir = LiveLayout(live_root(config)).evaluations()
        result = evaluate(config, model, index, networks.to(device), protocol=protocol, out_dir=out_dir, progress=progress)
    finally:
        index.close()
    result["mlflow_run"] = log_result(config, result, resolved.version)
    return result


def log_result(config: PipelineConfig, result: dict, version: str | None) -> str:
    """An MLflow run with the protocol and the metrics; the model version tagged with both."""
    from drape.ops.tracking import Tracker

    protocol, metrics = result["protocol"], result["metrics"]
    scope = protocol["split"]  # test_paired, test_unpaired or control
    tracker = Tracker(config)
    run_id = tracker.start_run(f"eval {protocol['split']} {protocol['mode']} {protocol['model']}", tags={"drape.kind": "eval"})
    tracker.log_params(run_id, {f"protocol.{key}": value for key, value in protocol.items()})
    tracker.log_metrics(run_id, {f"eval.{protocol['mode']}.{name}": value for name, value in metrics.items()})
    tracker.log_artifact(run_id, Path(result["directory"]) / "results.json", "eval")
    tracker.end_run(run_id)
    if version:
        tags = {f"drape.eval.{scope}.{name}": f"{value:.6g}" for name, value in metrics.items()}
        tracker.set_version_tags(version, {**tags, f"drape.eval.{scope}.run": run_id})
    return run_id
