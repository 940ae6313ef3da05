"""Does each gate check catch what it should, and only that? Detection and false-alarm rates.

Generates N control samples in memory at the config's resolution, takes their targets as the
clean outputs (what a perfect model renders), and runs the corruption suite of
`drape.gates.corruptions`: per check, the per-sample threshold that gives the chosen false-alarm rate
on the clean variants (mild noise, JPEG q90), then each corruption's detection rate against it.
Goals: detection >= 99%, false alarms <= 1%.

    .venv/bin/python benchmarks/gate_validity.py [--config configs/demo.yaml] [--samples 240] [--resolution 128] [--nuisance]

`--nuisance` calibrates on the wider suite of `drape.gates.nuisance` as well (what a reviewer
accepts): the detection it leaves is what the checks can tell from harmless variation.

At the demo's 64 px a face is 11×14 pixels and a logo letter about 6×4: `--resolution` renders the
control set larger (the production config runs at 1024 px) to measure the checks where faces and
marks are legible. The texture check is measured with its default melted and mirrored terms on
(configs/demo.yaml turns them off for its one-minute model); `--as-configured` measures the
config's own settings.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console

from drape.config import default_config_path, load_config
from drape.data.dataset import synthesize_split
from drape.gates.calibration import calibrate, render_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(default_config_path()))
    parser.add_argument("--samples", type=int, default=240)
    parser.add_argument("--false-alarm", type=float, default=0.01)
    parser.add_argument(
        "--resolution", type=int, default=None, help="render the control set at this size (default: the config's)"
    )
    parser.add_argument("--as-configured", action="store_true", help="the config's texture terms, not the defaults")
    parser.add_argument(
        "--nuisance",
        action="store_true",
        help="calibrate on the wider nuisance suite (drape.gates.nuisance: shifts, light, re-encoding, resizing, blur) "
        "besides the mild clean variants: what a reviewer accepts must pass",
    )
    args = parser.parse_args()
    config = load_config(args.config)
    if not args.as_configured:
        from drape.config import TextureGateConfig

        defaults = TextureGateConfig()
        texture = config.gates.texture.model_copy(
            update={"mirror_penalty": defaults.mirror_penalty, "sharpness_floor": defaults.sharpness_floor}
        )
        config = config.model_copy(update={"gates": config.gates.model_copy(update={"texture": texture})})
    if args.resolution:
        config = config.model_copy(update={"data": config.data.model_copy(update={"resolution": args.resolution})})
    started = time.perf_counter()
    control = synthesize_split(config, "control", args.samples)
    suites: dict[str, dict | None] = {"mild clean variants (noise, JPEG q90)": None}
    if args.nuisance:  # side by side: the suite the thresholds were set on before, and the wider one
        from drape.gates.corruptions import CLEAN
        from drape.gates.nuisance import NUISANCE

        suites["clean variants + the nuisance suite"] = {**CLEAN, **NUISANCE}
    texture = config.gates.texture
    for label, suite in suites.items():
        thresholds, rows = calibrate(config, control, false_alarm=args.false_alarm, clean_suite=suite)
        title = (
            f"gate validity: {args.samples} samples at {config.data.resolution} px, per-sample thresholds at "
            f"{args.false_alarm:.0%} false alarms on {label}, texture mirror_penalty {texture.mirror_penalty:g} "
            f"sharpness_floor {texture.sharpness_floor:g} ({time.perf_counter() - started:.0f} s)"
        )
        Console(width=150).print(render_table(thresholds, rows, false_alarm=args.false_alarm, title=title))


if __name__ == "__main__":
    main()
