"""Run a gate: sample the candidate on the control set and judge it against thresholds.

Writes into the gate directory: ``outputs/<sample id>.png`` (raw model outputs, the
validation_output artifact), ``latents.safetensors`` (initial noise and final samples, the
latent_snapshot artifact), ``report.json`` (GateReport) and ``grid.png`` (input, garment,
output, target per control sample).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

from drape.checkpoint import load_model
from drape.config import PipelineConfig
from drape.data.dataset import to_model_inputs
from drape.gates import CheckResult, GateReport, build_embedder, coherence_scores, identity_scores, texture_scores
from drape.model import sample
from drape.train import resolve_device


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """(N, 3, H, W) in [-1, 1] → (N, H, W, 3) uint8."""
    return ((images.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()


def generate_outputs(config: PipelineConfig, checkpoint: str | Path, control: dict, gate_dir: Path) -> np.ndarray:
    """Raw model outputs for the control set (fixed seed and sampler), saved as PNGs and latents."""
    device = resolve_device(config.train.device)
    model = load_model(checkpoint, prefer_ema=True).to(device)
    inputs = {k: v.to(device) for k, v in to_model_inputs(control).items()}
    generated = sample(model, config.diffusion, inputs, seed=config.gates.sample_seed)
    outputs = to_uint8(generated)
    (gate_dir / "outputs").mkdir(parents=True, exist_ok=True)
    for key, image in zip(control["keys"], outputs):
        Image.fromarray(image).save(gate_dir / "outputs" / f"{key}.png")
    save_file({"final": generated.float().cpu().contiguous()}, str(gate_dir / "latents.safetensors"))
    return outputs


def read_outputs(directory: str | Path, keys: list[str]) -> np.ndarray:
    """Output PNGs named by control sample id; a missing one is an error naming it."""
    images = []
    for key in keys:
        path = Path(directory) / f"{key}.png"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: expected an output for control sample {key!r}")
        images.append(np.asarray(Image.open(path).convert("RGB")))
    return np.stack(images)


def save_grid(path: Path, control: dict, outputs: np.ndarray, count: int) -> None:
    rows = min(count, len(outputs))
    size = outputs.shape[1]
    grid = Image.new("RGB", (4 * size, rows * size), (255, 255, 255))
    for row in range(rows):
        for col, image in enumerate((control["agnostic"][row], control["garment"][row], outputs[row], control["target"][row])):
            grid.paste(Image.fromarray(image), (col * size, row * size))
    scale = max(1, 256 // size)
    grid.resize((grid.width * scale, grid.height * scale), Image.Resampling.NEAREST).save(path)


def judge(config: PipelineConfig, *, stage: str, run_id: str, checkpoint: str, control: dict, control_set: str,
          outputs: np.ndarray, baseline_outputs: np.ndarray | None, baseline: dict | None) -> GateReport:
    """The GateReport for `outputs` on the control set; pure given its inputs."""
    keys, meta, gates = control["keys"], control["meta"], config.gates
    face_boxes = [m["face_box"] for m in meta]
    logo_boxes = [m["logo_box"] for m in meta]
    reference = baseline_outputs if baseline_outputs is not None else control["target"]
    reference_name = f"baseline v{baseline['version']} outputs" if baseline_outputs is not None else "ground-truth targets (no baseline yet)"
    values = {
        "identity": identity_scores(outputs, control["target"], face_boxes, build_embedder(gates)),
        "texture": texture_scores(outputs, control["target"], logo_boxes, gates.texture.max_shift_pixels),
        "coherence": coherence_scores(outputs, reference, control["mask"]),
    }
    thresholds = gates.thresholds(stage)
    report = GateReport(stage, run_id, checkpoint, control_set, baseline=baseline)
    for name, scores in values.items():
        report.checks[name] = CheckResult(name, {k: round(float(v), 6) for k, v in zip(keys, scores)}, thresholds[name],
                                          reference_name if name == "coherence" else "control targets")
    return report


def evaluate_gate(config: PipelineConfig, *, stage: str, run_id: str, checkpoint: str | Path, control: dict,
                  control_set: str, gate_dir: str | Path, baseline: dict | None = None,
                  baseline_outputs_dir: str | Path | None = None) -> GateReport:
    """Sample the candidate, judge it, and write outputs, latents, report.json and grid.png to `gate_dir`."""
    gate_dir = Path(gate_dir)
    gate_dir.mkdir(parents=True, exist_ok=True)
    outputs = generate_outputs(config, checkpoint, control, gate_dir)
    baseline_outputs = read_outputs(baseline_outputs_dir, control["keys"]) if baseline_outputs_dir else None
    report = judge(config, stage=stage, run_id=run_id, checkpoint=str(checkpoint), control=control, control_set=control_set,
                   outputs=outputs, baseline_outputs=baseline_outputs, baseline=baseline)
    (gate_dir / "report.json").write_text(json.dumps(report.to_dict(), indent=2))
    save_grid(gate_dir / "grid.png", control, outputs, config.gates.grid_samples)
    return report
