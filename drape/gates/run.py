"""Run a gate: sample the candidate on the control set and judge it against thresholds.

Writes into the gate directory: ``outputs/<sample id>.png`` (raw model outputs, the
validation_output artifact), ``latents.safetensors`` (initial noise and final samples, the
latent_snapshot artifact), ``report.json`` (GateReport) and ``grid.png`` (input, garment,
output, target per control sample).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw
from safetensors.torch import save_file

from drape.config import PipelineConfig
from drape.data.dataset import to_model_inputs
from drape.gates.checks.checks import FaceEmbedder, build_embedder, coherence_scores, identity_scores, texture_scores
from drape.gates.checks.degenerate import constant_outputs, opaque_rgb, refuse_constant
from drape.gates.checks.ocr import shared_text_check
from drape.gates.recognizers import RecognizerCheck, drift_values, recognizer_scores
from drape.gates.verdict.floor import Level, NuisanceLevels, nuisance_levels
from drape.gates.verdict.report import CHECKS, CheckResult, GateReport, recorded
from drape.gates.verdict.rules import sample_rule
from drape.training.checkpoints.checkpoint import load_model
from drape.training.loop.trainer import resolve_device
from drape.training.recipes.model import TryOnModel, configured_class_path, sample


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """(N, 3, H, W) in [-1, 1] → (N, H, W, 3) uint8."""
    return ((images.float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()


def sample_control(
    config: PipelineConfig, model: TryOnModel, control: dict, *, seed: int | None = None
) -> Iterator[tuple[list[str], torch.Tensor]]:
    """(keys, images in [-1, 1] on the CPU) of the control set, `gates.batch_size` samples at a time.

    Only one chunk's inputs and activations are on the device at once, so the gate's peak memory
    does not grow with the control set (512 samples at 1024×768 in production); each sample keeps
    its own noise (`first_index`), so the images are those one batch of the whole set would give.
    `seed`: default `gates.sample_seed`."""
    device = next(model.parameters()).device
    seed = config.gates.sample_seed if seed is None else seed
    size, total = config.gates.batch_size, len(control["keys"])
    for start in range(0, total, size):
        chunk = {name: values[start : start + size] for name, values in control.items()}
        inputs = {k: v.to(device) for k, v in to_model_inputs(chunk).items()}
        generated = sample(model, config.diffusion, inputs, seed=seed, first_index=start)
        yield list(chunk["keys"]), generated.cpu()


def generate_outputs(config: PipelineConfig, checkpoint: str | Path, control: dict, gate_dir: Path) -> np.ndarray:
    """Raw model outputs for the control set (fixed seed and sampler, `sample_control`), saved as
    PNGs and latents as each chunk is rendered."""
    device = resolve_device(config.train.device)
    model = load_model(checkpoint, prefer_ema=True, allowed=(configured_class_path(config),)).to(device)  # type: ignore[arg-type]
    (gate_dir / "outputs").mkdir(parents=True, exist_ok=True)
    finals, outputs = [], []
    for keys, generated in sample_control(config, model, control):
        images = to_uint8(generated)
        for key, image in zip(keys, images):
            Image.fromarray(image).save(gate_dir / "outputs" / f"{key}.png")
        finals.append(generated.float())
        outputs.append(images)
    save_file({"final": torch.cat(finals).contiguous()}, str(gate_dir / "latents.safetensors"))
    return np.concatenate(outputs)


def read_outputs(
    directory: str | Path, keys: list[str], shape: tuple[int, int] | None = None, *, reference: bool = False
) -> np.ndarray:
    """Output PNGs named by control sample id, each `shape` (height, width) when given (else the
    first one's); a missing, unreadable, transparent or differently sized one is an error naming it,
    and so is a constant one when the set is a `reference` (baseline or clean outputs,
    `drape.gates.checks.degenerate`)."""
    images: list[np.ndarray] = []
    for key in keys:
        path = Path(directory) / f"{key}.png"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: expected an output for control sample {key!r}")
        expected = shape or (images[0].shape[:2] if images else None)
        images.append(_read_output(path, expected))
    stacked = np.stack(images)
    if reference:
        refuse_constant(stacked, keys, directory)
    return stacked


def _read_output(path: Path, expected: tuple[int, int] | None) -> np.ndarray:
    """One output as opaque RGB, its size checked from the header before a pixel is decoded (a
    30000×30000 PNG of a few KiB is refused by name, not decoded; PIL's bomb guard is named too)."""
    try:
        with Image.open(path) as image:
            if image.format != "PNG":
                raise ValueError(f"{path}: a {image.format} image; expected a PNG")
            width, height = image.size
            if expected is not None and (height, width) != tuple(expected):
                raise ValueError(f"{path}: {width}×{height} px; expected {expected[1]}×{expected[0]} like the control set")
            return opaque_rgb(image, path)
    except (OSError, SyntaxError, Image.DecompressionBombError) as error:  # unidentified, truncated, a bomb
        raise ValueError(f"{path}: not a readable PNG ({error})") from None


def save_grid(
    path: Path, control: dict, outputs: np.ndarray, report: GateReport, count: int, baseline_outputs: np.ndarray | None = None
) -> None:
    """PNG grid, worst samples of each check first: label, input, garment, output, target[, baseline]."""
    index = {key: i for i, key in enumerate(control["keys"])}
    rows: list[tuple[str, int]] = []
    for check, key, value in report.worst_samples(per_check=2):
        rows.append((f"worst {check}\n{key}\n{value:.3f}", index[key]))
    shown = {i for _, i in rows}
    rows += [(key, index[key]) for key in control["keys"] if index[key] not in shown][: max(count - len(rows), 0)]
    columns = [control["agnostic"], control["garment"], outputs, control["target"]]
    columns += [baseline_outputs] if baseline_outputs is not None else []
    height, width = outputs.shape[1:3]
    cell_height = max(height, 128)
    cell = max(round(cell_height * width / height), 96)  # tiles keep the images' aspect (1024×768: 3:4)
    grid = Image.new("RGB", ((len(columns) + 1) * cell, len(rows) * cell_height + 24), "white")
    draw = ImageDraw.Draw(grid)
    for col, title in enumerate(["", "input", "garment", "output", "target", "baseline"][: len(columns) + 1]):
        draw.text((col * cell + 4, 4), title, fill="black")
    for row, (label, position) in enumerate(rows):
        top = 24 + row * cell_height
        draw.multiline_text((4, top + 4), label, fill="black")
        for col, images in enumerate(columns, start=1):
            tile = Image.fromarray(images[position]).resize((cell, cell_height), Image.Resampling.NEAREST)
            grid.paste(tile, (col * cell, top))
    grid.save(path)


def check_scores(
    config: PipelineConfig,
    control: dict,
    outputs: np.ndarray,
    reference: np.ndarray | None = None,
    *,
    embedder: FaceEmbedder | RecognizerCheck | None = None,
    checks: Collection[str] = CHECKS,
) -> dict[str, np.ndarray]:
    """Per-sample values of `checks` on `outputs`: identity and texture against the control
    targets, coherence against `reference` (a baseline's outputs or the targets; None: not scored)."""
    meta, gates = control["meta"], config.gates
    faces, logos, targets = [m["face_box"] for m in meta], [m["logo_box"] for m in meta], control["target"]
    values = {}
    if "identity" in checks:
        embedder = embedder or build_embedder(gates)
        if isinstance(embedder, RecognizerCheck):  # NaN: no face found in the output (report.py counts it apart)
            matches = embedder.matches(outputs, targets, faces, list(control["keys"]))
            values["identity"] = recognizer_scores(matches)
            if embedder.judges_drift:  # the same face drifted: the identity check's per-sample rule (judge)
                values["drift"] = drift_values(matches)
        else:
            values["identity"] = identity_scores(outputs, targets, faces, embedder)
    texture = gates.texture
    if "texture" in checks:
        values["texture"] = texture_scores(
            outputs,
            targets,
            logos,
            texture.max_shift_pixels,
            mirror_penalty=texture.mirror_penalty,
            sharpness_floor=texture.sharpness_floor,
        )
    if "texture" in checks and texture.ocr != "off":  # beside the glyph check: its own per-sample rule (judge)
        values["text"] = shared_text_check(texture.ocr).scores(outputs, targets, logos, list(control["keys"]))
    if "coherence" in checks and reference is not None:
        values["coherence"] = coherence_scores(outputs, reference, control["mask"])
    return values


def _reference_label(check: str, baseline: dict | None) -> str:
    if check == "coherence" and baseline:
        return f"baseline v{baseline['version']} outputs"
    return "ground-truth targets (no baseline yet)" if check == "coherence" else "control targets"


def judge(
    config: PipelineConfig,
    *,
    stage: str,
    run_id: str,
    checkpoint: str,
    control: dict,
    control_set: str,
    outputs: np.ndarray,
    baseline_outputs: np.ndarray | None,
    baseline: dict | None,
    levels: NuisanceLevels | None = None,
    outputs_dir: str | Path = "outputs",
) -> GateReport:
    """The GateReport for `outputs` on the control set; pure given its inputs. Value checks: identity
    and texture vs the control targets, coherence vs the baseline's outputs when given (else the
    ground truth), each against its threshold (a number, or "nuisance": the nuisance floor less
    `gates.floor_margin`); a recognizer's per-sample rule (`drape.gates.verdict.rules`). Change checks, with
    a baseline: each mean on the ground-truth scale may not fall more than `max_drop` (a number, or
    "nuisance": the largest fall under the nuisance suite). `levels`: floors and tolerances already
    measured. A constant output (`drape.gates.checks.degenerate`) fails the gate whatever the scores."""
    gates = config.gates
    embedder = build_embedder(gates)
    vs_baseline, targets = baseline_outputs is not None, control["target"]

    def scores(images: np.ndarray, reference: np.ndarray, checks: Collection[str] = CHECKS) -> dict[str, np.ndarray]:
        found = check_scores(config, control, images, reference, embedder=embedder, checks=checks)
        return {name: recorded(values) for name, values in found.items()}

    values = scores(outputs, targets if baseline_outputs is None else baseline_outputs)
    text, drift = values.pop("text", None), values.pop("drift", None)  # OCR's readings, dlib's drift: per-sample rules
    own, baseline_own = {}, {}
    if baseline_outputs is not None:
        # the change checks compare both on the ground-truth scale: coherence vs the targets too
        own = {**values, **scores(outputs, targets, ("coherence",))}
        baseline_own = scores(baseline_outputs, targets)
    if levels is None and gates.nuisance_floor:
        levels = nuisance_levels(
            config, control, baseline_outputs=baseline_outputs, baseline_scores=baseline_own, embedder=embedder
        )
    thresholds = gates.thresholds(stage, vs_baseline=vs_baseline)
    report = GateReport(stage, run_id, checkpoint, control_set, baseline=baseline)
    report.provenance = constant_outputs(outputs, control["keys"], outputs_dir)
    for name in values:
        floor = levels.floor.get(name) if levels else None
        threshold, source = _value_threshold(name, thresholds[name], floor, gates.floor_margin)
        change = _change_check(name, getattr(gates, name).max_drop, levels, own, baseline_own, vs_baseline)
        report.checks[name] = CheckResult(
            name,
            dict(zip(control["keys"], values[name].tolist())),
            threshold,
            _reference_label(name, baseline if vs_baseline else None),
            method=getattr(gates, name).method,
            threshold_source=source,
            floor=None if floor is None else floor.value,
            floor_variant="" if floor is None else floor.variant,
            **sample_rule(name, gates, embedder, control["keys"], values[name], text, drift),
            **change,
        )
    return report


def _value_threshold(
    check: str, configured: float | str | None, floor: Level | None, margins: Mapping[Any, float] | None = None
) -> tuple[float | None, str]:
    """(the threshold, where it came from): as configured, or for 'nuisance' the floor less the
    check's margin in `margins` (`gates.floor_margin`)."""
    margin = (margins or {}).get(check, 0.0)
    if configured == "off":
        return None, "off"
    if configured != "nuisance":
        return (None if configured is None else float(configured)), "config"
    if floor is None:  # the config refuses a 'nuisance' threshold without gates.nuisance_floor
        raise ValueError(f"the {check} threshold is 'nuisance' but no nuisance floor was measured")
    if margin:
        return floor.value - margin, f"nuisance floor ({floor.variant}) less margin {margin:g}"
    return floor.value, f"nuisance floor ({floor.variant})"


def _change_check(
    check: str, max_drop: float | str | None, levels: NuisanceLevels | None, own: dict, baseline_own: dict, vs_baseline: bool
) -> dict:
    """The CheckResult fields of `check`'s change check: its means, tolerance and where that came from."""
    if max_drop is None:
        return {"change_note": "no change check configured (max_drop unset)"}
    if not vs_baseline:
        return {"change_note": "no baseline yet (first run of this stage): change check skipped"}
    if max_drop == "nuisance":
        tolerance = levels.tolerance.get(check) if levels else None
        if tolerance is None:  # the config refuses max_drop 'nuisance' without gates.nuisance_floor
            raise ValueError(f"gates.{check}.max_drop is 'nuisance' but no nuisance levels were measured")
        drop, source = tolerance.value, f"nuisance ({tolerance.variant})"
    else:
        drop, source = float(max_drop), "config"
    return {
        "baseline_mean": float(np.nanmean(baseline_own[check])),  # NaN: no face found (a recognizer's outcome)
        "change_mean": float(np.nanmean(own[check])),
        "max_drop": drop,
        "drop_source": source,
    }


def provenance_problems(
    config: PipelineConfig,
    checkpoint: str | Path,
    *,
    stage: str,
    data_manifest_hash: str = "",
    start_checkpoint: str | Path | None = None,
) -> list[str]:
    """Why the candidate is not what this stage trained, if it is not (empty list: it is).

    A reviewer asks first whether they are looking at the right thing; so does the gate. The
    candidate's manifest must name this stage and the run's dataset, and the stage's trainable
    parameters must differ from the checkpoint the stage started from: a checkpoint of an earlier
    stage, or one the stage never trained, is refused even when its outputs look fine (an earlier
    stage's model renders much the same images; nothing else would tell). Reads the manifests and
    the trainable tensors only, never the whole model.
    """
    from drape.training.checkpoints.checkpoint import model_tensor_names, read_manifest, read_model_tensors
    from drape.training.recipes.model import PIXEL_DIT, resolve_class, trainable_parameter_names

    manifest, problems = read_manifest(checkpoint), []
    if manifest.get("stage") != stage:
        problems.append(f"provenance: the candidate was trained for stage {manifest.get('stage')!r}, not {stage!r}")
    recorded = manifest.get("data_manifest_hash")
    if data_manifest_hash and recorded and recorded != data_manifest_hash:
        problems.append(
            f"provenance: the candidate was trained on dataset {recorded[:12]}, this run's is {data_manifest_hash[:12]}"
        )
    if start_checkpoint is not None:
        # only the stage's trainable tensors are read, from the safetensors files: sampling the candidate
        # next verifies every sha256 of it, and the stage verified its start when it loaded it
        frozen = resolve_class(manifest.get("model_class", PIXEL_DIT), (configured_class_path(config),)).frozen_prefixes
        names = trainable_parameter_names(config.train.stages[stage].trainable, model_tensor_names(checkpoint), frozen)
        candidate, start = read_model_tensors(checkpoint, names), read_model_tensors(start_checkpoint, names)
        if names and all(torch.equal(candidate[name], start[name]) for name in names):
            problems.append(
                f"provenance: the stage's trainable parameters ({len(names)} tensors) are identical to its "
                f"starting checkpoint {Path(start_checkpoint).name}: the stage did not train"
            )
    return problems


def evaluate_gate(
    config: PipelineConfig,
    *,
    stage: str,
    run_id: str,
    checkpoint: str | Path,
    control: dict,
    control_set: str,
    gate_dir: str | Path,
    baseline: dict | None = None,
    baseline_outputs_dir: str | Path | None = None,
    provenance: list[str] | None = None,
) -> GateReport:
    """Sample the candidate, judge it, and write outputs, latents, report.json and grid.png to `gate_dir`.

    `provenance`: problems `provenance_problems` found; any of them fails the gate.
    """
    gate_dir = Path(gate_dir)
    gate_dir.mkdir(parents=True, exist_ok=True)
    outputs = generate_outputs(config, checkpoint, control, gate_dir)
    shape = control["target"].shape[1:3]
    baseline_outputs = (
        read_outputs(baseline_outputs_dir, control["keys"], shape, reference=True) if baseline_outputs_dir else None
    )
    report = judge(
        config,
        stage=stage,
        run_id=run_id,
        checkpoint=str(checkpoint),
        control=control,
        control_set=control_set,
        outputs=outputs,
        baseline_outputs=baseline_outputs,
        baseline=baseline,
        outputs_dir=gate_dir / "outputs",
    )
    report.provenance = list(provenance or []) + report.provenance
    distribution: list = []  # eval.fid_gate: FID/KID vs the baseline's, at a bootstrap bound (drape.eval.gate)
    if config.eval.fid_gate.enabled and baseline_outputs is not None:
        from drape.eval.gate import distribution_checks

        distribution = distribution_checks(config.eval, control["target"], outputs, baseline_outputs)
        report.provenance += [line for check in distribution for line in check.failures()]
    written = {**report.to_dict(), "distribution": [check.to_dict() for check in distribution]}
    (gate_dir / "report.json").write_text(json.dumps(written, indent=2))
    save_grid(gate_dir / "grid.png", control, outputs, report, config.gates.grid_samples, baseline_outputs)
    return report
