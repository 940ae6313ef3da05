"""Evaluate a model on a split: sample it batch by batch as the gates do, measure, persist, resume.

Sampling is the gates' own (`drape.training.recipes.model.sample`: the objective's sampler and
`diffusion.guidance_scale`), with sample i of the split starting from noise i of the seed, so an
image does not depend on the batch it was drawn in. Each batch's per-sample records
(`drape.eval.metrics.batch_records`) are written to ``batch-<first sample>.npz`` (a temporary name,
then renamed) in the run's directory; a run started again with the same protocol skips every
batch already there, so a 2,032-pair test set survives a lost node. The directory is named by the
protocol's hash: another protocol never reuses another's batches.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from drape.config import PipelineConfig
from drape.data.reader import ShardIndex, to_model_inputs
from drape.eval.features import RESIZE_DESCRIPTIONS, FeatureNetworks
from drape.eval.metrics import batch_records, summarize
from drape.storage.checksum import sha256_bytes
from drape.training.recipes.model import TryOnModel, sample

RECORD_FIELDS = ("fake_features", "real_features", "ssim", "lpips")
Progress = Callable[[int, int], None]


def build_protocol(
    config: PipelineConfig, *, dataset: str, split: str, mode: str, num_samples: int, model: str, source: str = "unknown"
) -> dict:
    """What the numbers were measured under: published numbers compare only under the same protocol
    (`drape.eval.published`). `source`: what the dataset was made from (`session.dataset_source`)."""
    diffusion, data, settings = config.diffusion, config.data, config.eval
    return {
        "model": model,
        "dataset": dataset,
        "source": source,
        "split": split,
        "mode": mode,
        "samples": num_samples,
        "resolution": [data.height, data.width],
        "resize": settings.fid_resize,
        "seed": config.gates.sample_seed if settings.seed is None else settings.seed,
        "sampler": f"{diffusion.objective}, {diffusion.sampling_steps} steps",
        "guidance_scale": diffusion.guidance_scale,
        "guidance_conditions": list(diffusion.guidance_conditions),
        "inception": Path(settings.inception_path or "").name,
        "lpips": f"alex ({Path(settings.lpips_backbone_path or '').name})" if mode == "paired" else None,
        "kid_subsets": settings.kid_subsets,
        "kid_subset_size": min(settings.kid_subset_size, num_samples),
    }


def protocol_id(protocol: dict) -> str:
    return "eval-" + sha256_bytes(json.dumps(protocol, sort_keys=True).encode())[:16]


def describe_protocol(protocol: dict) -> str:
    """One line for people, printed beside the numbers."""
    height, width = protocol["resolution"]
    guidance = f"guidance {protocol['guidance_scale']:g}"
    guidance += f" on {', '.join(protocol['guidance_conditions'])}" if protocol["guidance_scale"] > 1 else " (none)"
    lpips = f", LPIPS {protocol['lpips']}" if protocol["lpips"] else ""
    resize = RESIZE_DESCRIPTIONS.get(protocol["resize"], protocol["resize"])
    return (
        f"{protocol['dataset']} ({protocol.get('source', 'unknown')}) {protocol['split']} ({protocol['mode']}): "
        f"{protocol['samples']} samples at "
        f"{height}×{width} px, {resize}; seed {protocol['seed']}, {protocol['sampler']}, {guidance}; "
        f"FID/KID features {protocol['inception']}, KID {protocol['kid_subsets']} subsets of {protocol['kid_subset_size']}"
        f"{lpips}; model {protocol['model']}"
    )


def _to_uint8(images: torch.Tensor) -> np.ndarray:
    return ((images.float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()


def _saved_batch(path: Path, keys: list[str]) -> dict | None:
    """The records in `path` if it holds exactly these samples' records; None if absent or damaged."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            records = {name: saved[name] for name in saved.files}
    except (OSError, ValueError):
        return None
    if list(records.get("keys", [])) != keys or any(len(v) != len(keys) for v in records.values()):
        return None
    return records


def _save_batch(path: Path, keys: list[str], records: dict) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        np.savez(handle, keys=np.asarray(keys), **records)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _generate(config: PipelineConfig, model: TryOnModel, arrays: dict, *, seed: int, first_index: int) -> np.ndarray:
    device = next(model.parameters()).device
    inputs = {name: value.to(device) for name, value in to_model_inputs(arrays).items()}
    with torch.no_grad():
        return _to_uint8(sample(model, config.diffusion, inputs, seed=seed, first_index=first_index))


def evaluate(
    config: PipelineConfig,
    model: TryOnModel,
    index: ShardIndex,
    networks: FeatureNetworks,
    *,
    protocol: dict,
    out_dir: str | Path,
    progress: Progress | None = None,
) -> dict:
    """Metrics of `model` on the first `protocol['samples']` samples of `index`; batches persisted
    under `out_dir`/<protocol id>/ and reused when present. Returns {metrics, protocol, directory,
    resumed_batches}; results.json holds the same."""
    if protocol["samples"] < 2:
        raise ValueError(f"{protocol['dataset']} {protocol['split']}: {protocol['samples']} samples; FID and KID need at least 2")
    directory = Path(out_dir) / protocol_id(protocol)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "protocol.json").write_text(json.dumps(protocol, indent=2))
    total, size = protocol["samples"], config.eval.batch_size or config.gates.batch_size
    paired, fields = protocol["mode"] == "paired", (*index.model_fields, "meta")
    collected: list[dict] = []
    resumed = 0
    for start in range(0, total, size):
        keys = index.keys[start : min(start + size, total)]
        path = directory / f"batch-{start:08d}.npz"
        records = _saved_batch(path, keys)
        if records is None:
            arrays = index.take(range(start, start + len(keys)), fields)
            generated = _generate(config, model, arrays, seed=protocol["seed"], first_index=start)
            records = batch_records(networks, generated, arrays["target"], paired=paired)
            _save_batch(path, keys, records)
        else:
            resumed += 1
        collected.append(records)
        if progress:
            progress(start + len(keys), total)
    merged = {name: np.concatenate([r[name] for r in collected]) for name in RECORD_FIELDS if name in collected[0]}
    settings = config.eval
    metrics = summarize(merged, paired=paired, kid_subset_size=settings.kid_subset_size, kid_subsets=settings.kid_subsets)
    result = {"metrics": metrics, "protocol": protocol, "directory": str(directory), "resumed_batches": resumed}
    temporary = directory / ".results.json.tmp"
    temporary.write_text(json.dumps(result, indent=2))
    os.replace(temporary, directory / "results.json")
    return result
