"""The text check's OCR engines alone on real images: per kind, the share of samples whose output
does not read as its source (`drape.gates.checks.ocr.TextCheck`, similarity under 1), and each engine's
time per sample. The control set and kinds are gate_real.py's: `real_control` (two portraits, a
word printed on the chest), the wide harmless suite (what must read the same: false alarms) and
the three text regressions (a look-alike letter, the last letter lost, one character changed:
detection). The glyph check, dlib and the gate-level redraws are gate_real.py's (all ways at once,
an hour of one core at 40 samples and two sizes); this runs the readers only.

    .venv/bin/python benchmarks/gate_ocr.py [--samples 40] [--resolution 128 256] [--engine rapidocr tesseract] \\
        [--kinds denoise look-alike]

`--kinds` keeps the kinds whose names contain one of the words given (while iterating on one kind).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.cases.real_cases import real_control
from drape.gates.checks.ocr import shared_text_check
from drape.gates.suites.harmless import suite


def kinds(size: int, samples: int, seed: int, only: list[str]) -> tuple[dict, dict[str, tuple[bool, np.ndarray]]]:
    """(the control set, {kind: (must fail, outputs)}): the kinds whose names contain a word of `only` (all if empty)."""
    from gate_real import regressions  # benchmarks/ is on the path when this file runs as a script

    control = real_control(size, samples, seed)
    targets, meta = control["target"], control["meta"]
    wanted = lambda name: not only or any(word in name for word in only)  # noqa: E731
    found = {
        name: (False, variant(targets, meta, np.random.default_rng(seed)))
        for name, variant in suite("wide").items()
        if wanted(name)
    }
    found.update({name: (True, outputs) for name, outputs in regressions(control, seed)["texture"].items() if wanted(name)})
    if not found:
        raise SystemExit(f"--kinds {' '.join(only)}: no kind's name contains any of these words")
    return control, found


def measure(engine: str, control: dict, found: dict) -> tuple[dict[str, float], float, list[str]]:
    """({kind: share of samples misread}, seconds per output sample, examples of harmless misreads)."""
    check = shared_text_check(engine)
    boxes, keys = [m["logo_box"] for m in control["meta"]], list(control["keys"])
    check.scores(control["target"], control["target"], boxes, keys)  # the sources read once, as a gate does
    rates, spent, examples = {}, 0.0, []
    for name, (must_fail, outputs) in found.items():
        started = time.perf_counter()
        values = check.scores(outputs, control["target"], boxes, keys)
        spent += time.perf_counter() - started
        misread = np.nan_to_num(values, nan=1.0) < 1.0 - 1e-9
        rates[name] = float(misread.mean())
        if not must_fail:
            examples += [f"{name}: {check.last_reads[k]}" for k, bad in zip(keys, misread) if bad][:2]
    return rates, spent / (len(found) * len(keys)), examples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--resolution", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--engine", nargs="+", default=["rapidocr", "tesseract"], choices=["rapidocr", "tesseract"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", nargs="*", default=[], help="only the kinds whose names contain one of these words")
    args = parser.parse_args()
    console = Console(width=200)
    table = Table(
        title=f"OCR alone, {args.samples} real samples per kind: share misread (red: detection < 99%, false alarms > 1%)"
    )
    table.add_column("kind")
    results, times = {}, {}
    for size in args.resolution:
        control, found = kinds(size, args.samples, args.seed, args.kinds)
        for engine in args.engine:
            table.add_column(f"{size} px {engine}", justify="right")
            results[size, engine], times[size, engine], examples = measure(engine, control, found)
            for line in examples:
                console.print(f"{size} px {engine} harmless misread (source, output): {line}", highlight=False)
    for name, (must_fail, _) in found.items():
        cells = []
        for key in results:
            rate = results[key][name]
            good = rate >= 0.99 if must_fail else rate <= 0.01
            cells.append(f"{rate:.1%}" if good else f"[red]{rate:.1%}[/red]")
        table.add_row(("regression: " if must_fail else "") + name, *cells)
    table.add_row("time per output sample, ms", *(f"{times[key] * 1000:.0f}" for key in results))
    console.print(table)


if __name__ == "__main__":
    main()
