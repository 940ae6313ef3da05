"""Identity drift per sample: the face's local geometry (`drape.gates.recognizers.warp.face_warp`,
`gates.identity.max_warp`) beside dlib's blurred-descriptor distance (`max_drift`, the baseline), on
real portraits (`benchmarks.cases.real_cases.real_control`: two portraits framed at random).

Per sample and per way: the largest drift any harmless kind gives (`drift_suite()`: the wide suite
and the kinds it lacks: JPEG q90, gamma 0.9 and 1.1, a stronger unsharp mask, a 1 px shift then
JPEG q75), the smallest any regression gives (the lower face squashed 10%, the eyes set 10% closer,
another person's face), and the margin between them; then per way the samples it separates, the
smallest and median margin, the ratio of the weakest regression to the strongest harmless change
over all samples, and where a single limit can sit (the gap); per kind the largest (harmless) or
smallest (regression) drift over the samples; and the time per face (median).

    .venv/bin/python benchmarks/drift_margins.py --resolution 256 --samples 16 [--no-baseline]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.cases.real_cases import FaceScene, drift_face, real_control, swap_face
from drape.gates.recognizers import RecognizerCheck, drift_values
from drape.gates.recognizers.dlib_face import DRIFT_DISTANCE, DlibRecognizer
from drape.gates.recognizers.warp import face_warps
from drape.gates.suites.harmless import drift_suite

OTHER = {"astronaut": "hopper", "hopper": "astronaut"}
REGRESSIONS = {
    "lower face squashed 10%": lambda scene: drift_face(scene, 0.55, 1.0, 0.9, 0),
    "eyes set 10% closer": lambda scene: drift_face(scene, 0.3, 0.55, 0.9, 1),
    "another person": lambda scene: swap_face(scene, OTHER[scene.person]),
}


def kinds(control: dict, seed: int) -> dict[str, tuple[bool, np.ndarray]]:
    """{kind: (is a regression, the control targets changed by it)}."""
    targets, meta = control["target"], control["meta"]
    found = {name: (False, change(targets, meta, np.random.default_rng(seed))) for name, change in drift_suite().items()}
    scenes = [FaceScene(t, tuple(m["face_box"]), m["person"]) for t, m in zip(targets, meta)]  # type: ignore[arg-type]
    found.update({name: (True, np.stack([edit(scene) for scene in scenes])) for name, edit in REGRESSIONS.items()})
    return found


def measure(control: dict, found: dict, dlib: RecognizerCheck | None, timing: dict) -> dict[str, dict[str, np.ndarray]]:
    """{way: {kind: per-sample drift}}: 'warp' (share of the face width) and 'descriptor' (dlib distance
    of the blurred faces; NaN where dlib finds no face or calls it another person)."""
    targets, keys = control["target"], control["keys"]
    boxes = [m["face_box"] for m in control["meta"]]
    out: dict[str, dict[str, np.ndarray]] = {"warp": {}, "descriptor": {}} if dlib else {"warp": {}}
    for name, (_, outputs) in found.items():
        started = time.perf_counter()
        out["warp"][name] = face_warps(outputs, targets, boxes)
        timing.setdefault("warp", []).append((time.perf_counter() - started) / len(outputs))
        if dlib is None:
            continue
        started = time.perf_counter()
        matches = dlib.matches(outputs, targets, boxes, keys)
        # another person (dlib's distance rule) or no face: as far as the descriptor drift goes
        out["descriptor"][name] = np.array(
            [
                np.inf if match.similarity is None or not match.same else drift
                for match, drift in zip(matches, drift_values(matches))
            ]
        )
        timing.setdefault("descriptor", []).append((time.perf_counter() - started) / len(outputs))
    return out


def per_sample(values: dict[str, np.ndarray], found: dict) -> tuple[np.ndarray, list[str], np.ndarray, list[str]]:
    """(max harmless drift per sample, its kind, min regression drift per sample, its kind)."""
    harmless = [name for name, (bad, _) in found.items() if not bad]
    regressions = [name for name, (bad, _) in found.items() if bad]
    high = np.stack([values[name] for name in harmless])
    low = np.stack([values[name] for name in regressions])
    top, bottom = np.nanargmax(high, axis=0), np.nanargmin(low, axis=0)
    columns = np.arange(high.shape[1])
    return high[top, columns], [harmless[k] for k in top], low[bottom, columns], [regressions[k] for k in bottom]


def run(size: int, samples: int, seed: int, console: Console, baseline: bool = True) -> None:
    control = real_control(size, samples, seed)
    found = kinds(control, seed)
    timing: dict[str, list[float]] = {}
    started = time.perf_counter()
    dlib = RecognizerCheck(DlibRecognizer(max_drift=DRIFT_DISTANCE)) if baseline else None
    values = measure(control, found, dlib, timing)
    console.print(
        f"{size} px, {samples} samples, {sum(1 for bad, _ in found.values() if not bad)} harmless kinds, "
        f"{len(REGRESSIONS)} regressions: {time.perf_counter() - started:.0f} s",
        highlight=False,
    )
    table = Table(title=f"per sample at {size} px: the strongest harmless drift, the weakest regression's, the margin")
    for column in ("sample", "person", "face px"):
        table.add_column(column)
    for way in values:
        for column in ("max harmless", "kind", "min regression", "kind", "margin"):
            table.add_column(f"{way} {column}", justify="right" if "kind" not in column else "left")
    rows = {way: per_sample(values[way], found) for way in values}
    for index, (key, meta) in enumerate(zip(control["keys"], control["meta"])):
        cells = [key, meta["person"], f"{meta['face_box'][2] - meta['face_box'][0]:.0f}"]
        for high, high_kind, low, low_kind in rows.values():
            margin = low[index] - high[index]
            cells += [f"{high[index]:.4f}", high_kind[index], f"{low[index]:.4f}", low_kind[index], _signed(margin)]
        table.add_row(*cells)
    console.print(table)
    by_kind = Table(title=f"per kind at {size} px: the largest drift over the samples (harmless), the smallest (regressions)")
    for column in ("kind", "regression", *values):
        by_kind.add_column(column, justify="left" if column == "kind" else "right")
    for name, (bad, _) in found.items():
        reduce = np.nanmin if bad else np.nanmax
        by_kind.add_row(name, "yes" if bad else "", *(f"{reduce(values[way][name]):.4f}" for way in values))
    console.print(by_kind)
    summary = Table(title=f"summary at {size} px (margins: the weakest regression less the strongest harmless change)")
    for column in ("way", "samples separated", "min margin", "median margin", "max harmless", "min regression", "gap", "ratio"):
        summary.add_column(column, justify="right")
    for way, (high, _, low, _) in rows.items():
        margins = low - high
        gap, ratio = float(np.min(low) - np.max(high)), float(np.min(low) / np.max(high))
        summary.add_row(
            way,
            f"{int((margins > 0).sum())}/{len(margins)}",
            _signed(float(np.min(margins))),
            _signed(float(np.median(margins))),
            f"{np.max(high):.4f}",
            f"{np.min(low):.4f}",
            _signed(gap),
            f"{ratio:.2f}x",
        )
    console.print(summary)
    times = ", ".join(f"{way} {np.median(spent) * 1000:.1f} ms" for way, spent in timing.items())
    if "descriptor" in timing:
        ratio = np.median(timing["descriptor"]) / np.median(timing["warp"])
        times += f" (descriptor: dlib's detection, landmarks and both descriptors; descriptor / warp {ratio:.2f}x)"
    console.print(f"time per face, median over kinds: {times}", highlight=False)


def _signed(value: float) -> str:
    return f"{value:+.4f}" if value > 0 else f"[red]{value:+.4f}[/red]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolution", type=int, nargs="+", default=[256])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-baseline", action="store_true", help="the warp alone (dlib's descriptors cost ~5x as much)")
    args = parser.parse_args()
    console = Console(width=260)
    for size in args.resolution:
        run(size, args.samples, args.seed, console, baseline=not args.no_baseline)


if __name__ == "__main__":
    main()
