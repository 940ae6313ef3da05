"""Does each gate check catch what it should, and only that? Detection and false-alarm rates.

Generates N control samples in memory at the config's resolution, takes their targets as the
clean outputs (what a perfect model renders), and runs the corruption suite of
`drape.corruptions`: per check, the per-sample threshold that gives the chosen false-alarm rate
on the clean variants (mild noise, JPEG q90), then each corruption's detection rate against it.
Goals: detection >= 99%, false alarms <= 1%.

    .venv/bin/python benchmarks/gate_validity.py [--config configs/demo.yaml] [--samples 240]
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console

from drape.calibrate import calibrate, render_table
from drape.config import default_config_path, load_config
from drape.data.dataset import synthesize_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(default_config_path()))
    parser.add_argument("--samples", type=int, default=240)
    parser.add_argument("--false-alarm", type=float, default=0.01)
    args = parser.parse_args()
    config = load_config(args.config)
    started = time.perf_counter()
    control = synthesize_split(config, "control", args.samples)
    thresholds, rows = calibrate(config, control, false_alarm=args.false_alarm)
    title = (f"gate validity: {args.samples} samples at {config.data.resolution} px, per-sample thresholds at "
             f"{args.false_alarm:.0%} false alarms ({time.perf_counter() - started:.0f} s)")
    table = render_table(thresholds, rows, false_alarm=args.false_alarm, title=title)
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
