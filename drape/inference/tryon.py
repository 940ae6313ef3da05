"""`drape tryon`: render try-ons with a promoted model, seed fixed, one PNG per input and a grid.

The variant is the one `drape bench inference` recommended for the model (``inference.json``
next to it) unless told otherwise; a variant this device cannot run falls back to the reference,
and the summary says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from drape.config import PipelineConfig, VariantSpec
from drape.data.dataset import to_model_inputs
from drape.inference.bench import read_inference_config
from drape.inference.source import InferenceInputError, captured_inputs, resolve_model
from drape.inference.stick import request
from drape.inference.variants import prepare, reference_spec, resolved, unavailable

RECOMMENDED = "recommended"


def choose_variant(config: PipelineConfig, name: str, home: Path, device: torch.device) -> tuple[VariantSpec, str]:
    """(resolved spec, how it was chosen) for `name`: 'recommended', 'reference' or a configured variant."""
    reference = reference_spec(device)
    if name == "reference":
        return reference, "the reference"
    if name == RECOMMENDED:
        spec = read_inference_config(home)
        if spec is None:
            return reference, f"the reference (no {home / 'inference.json'}: run `drape bench inference`)"
        chosen, how = resolved(spec, reference), f"recommended by the benchmark ({home / 'inference.json'})"
    else:
        named = {v.name: v for v in config.inference.variants}
        if name not in named:
            raise InferenceInputError(f"variant {name!r}: expected recommended, reference or one of {', '.join(named)}")
        chosen, how = resolved(named[name], reference), "as asked"
    if reason := unavailable(chosen, device):
        return reference, f"the reference ({chosen.name} cannot run here: {reason})"
    return chosen, f"{chosen.name}, {how}"


def _tile(image: np.ndarray, height: int, width: int) -> Image.Image:
    return Image.fromarray(image).resize((width, height), Image.Resampling.NEAREST)


def save_grid(path: Path, control: dict, outputs: np.ndarray) -> None:
    """Rows of input (agnostic), garment, try-on and the control's target, tiles keeping the aspect."""
    height, width = outputs.shape[1:3]
    cell_h = max(height, 128)
    cell_w = max(round(cell_h * width / height), 96)
    columns = [
        ("input", control["agnostic"]),
        ("garment", control["garment"]),
        ("try-on", outputs),
        ("target", control["target"]),
    ]
    grid = Image.new("RGB", (len(columns) * cell_w, 20 + len(outputs) * (cell_h + 14)), "white")
    draw = ImageDraw.Draw(grid)
    for col, (title, _) in enumerate(columns):
        draw.text((col * cell_w + 4, 4), title, fill="black")
    for row, key in enumerate(control["keys"]):
        top = 20 + row * (cell_h + 14)
        draw.text((4, top), key, fill="black")
        for col, (_, images) in enumerate(columns):
            grid.paste(_tile(images[row], cell_h, cell_w), (col * cell_w, top + 14))
    temporary = path.with_name(f".{path.name}.tmp.png")
    grid.save(temporary)
    temporary.replace(path)


def render_tryons(
    config: PipelineConfig,
    *,
    out: Path,
    model: str | None = None,
    inputs: str | None = None,
    variant: str = RECOMMENDED,
    seed: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    adapter: Path | None = None,
    shopper: str | None = None,
) -> dict:
    """Render every input with the model (with a shopper's `adapter` merged in, when given); write
    ``<key>.png``, ``grid.png`` and ``tryon.json`` to `out`."""
    from drape.training.checkpoints.checkpoint import load_model
    from drape.training.loop.trainer import resolve_device
    from drape.training.recipes.model import configured_class_path

    device = resolve_device(config.train.device)
    source = resolve_model(config, model)
    control, control_set = captured_inputs(config, inputs)
    spec, how = choose_variant(config, variant, source.home, device)
    if adapter is not None:
        from drape.shoppers.adapter import apply

        loaded = apply(config, source.checkpoint, adapter)
    else:
        loaded = load_model(source.checkpoint, prefer_ema=True, allowed=(configured_class_path(config),))
    prepared = prepare(loaded, spec, device, config.diffusion.sampling_steps)
    seed = config.inference.seed if seed is None else seed
    inputs_all = to_model_inputs(control)
    out.mkdir(parents=True, exist_ok=True)
    images = []
    for index, key in enumerate(control["keys"]):
        one = {k: v[index : index + 1].to(device=device, dtype=prepared.dtype) for k, v in inputs_all.items()}
        image = request(prepared, config.diffusion, one, seed)[0]
        temporary = out / f".{key}.tmp.png"
        Image.fromarray(image).save(temporary)
        temporary.replace(out / f"{key}.png")
        images.append(image)
        if progress:
            progress(index + 1, len(control["keys"]))
    save_grid(out / "grid.png", control, np.stack(images))
    summary = {
        "model": source.label,
        "checkpoint": str(source.checkpoint),
        "adapter": str(adapter) if adapter else None,
        "shopper": shopper,
        "variant": spec.model_dump(),
        "chosen": how,
        "steps": prepared.steps,
        "seed": seed,
        "control_set": control_set,
        "outputs": [f"{key}.png" for key in control["keys"]],
        "grid": "grid.png",
    }
    (out / "tryon.json").write_text(json.dumps(summary, indent=2))
    return summary
