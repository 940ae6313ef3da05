"""The gates' real recognizers on real images: detection and false alarms per kind, per sample and at
the gate, at 128 and 256 px; the margin between each check's harmless floor and the weakest
regression it must catch; each recognizer's time per sample on this CPU.

The control set is `benchmarks.cases.real_cases.real_control`: two real portraits (skimage's astronaut,
matplotlib's Grace Hopper) framed at random, a word printed on the chest. What must pass: the wide
harmless suite (`drape.gates.suites.harmless.suite('wide')`: the nuisance suite, tone curves, sharpening,
denoising, resampling, compound registrations). What must fail, per check:
- identity: the other person's face blended in (another person), the face covered by a texture (no
  face), and two drifts of the same face (eyes set closer, lower face squashed);
- texture: a letter replaced by a look-alike (L→I, O→Q, …), the word's last letter lost, one
  character changed (a price digit, a letter).

Ways compared side by side, the recognizers and the checks they add to:
- dlib: the per-sample rule in dlib's terms (no face found, or a distance over 0.6, fails), and at
  the gate also the lower bound of the mean similarity against a threshold;
- dlib+drift: and the drift rule (`gates.identity.max_drift`): the same person whose blurred faces'
  descriptors are further apart than `DRIFT_DISTANCE` (0.17, set on the first 40 samples at 256 px) fails;
- pixel: the synthetic demo's pixel embedder on the fixed box, per-sample threshold at the harmless
  floor (the lowest value of any harmless kind over the first `CALIBRATION` samples) less `MARGIN`;
- ocr: PP-OCR readings, the per-sample rule "reads as the source" (the median over three crops of
  1 less the normalized edit distance = 1);
- tesseract: the same rule through Tesseract (Debian's tesseract-ocr), the second OCR engine;
- glyph: the correlation texture check, per-sample threshold as the pixel embedder's;
- glyph+ocr: the texture check as configured with ocr: either failing fails.
At the gate: `--redraws` control sets of `--samples` drawn with replacement from the kind's samples;
a value check fails below the lowest 1% quantile of the harmless kinds' redrawn lower bounds (for
OCR the mean text similarity: `gates.texture.min_text_lower`), a rule fails when more than its share
of the samples break it (dlib: `max_share`, 1%; OCR: `OCR_SHARE`, 25%, a backstop).

    .venv/bin/python benchmarks/gate_validity.py --real [--samples 40] [--resolution 128 256]
"""

from __future__ import annotations

import time

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.cases.real_cases import FaceScene, drift_face, erase_face, print_word, real_control, swap_face
from drape.gates.checks.checks import PixelFaceEmbedder, identity_scores, texture_scores
from drape.gates.checks.ocr import shared_text_check
from drape.gates.recognizers import RecognizerCheck, drift_values, recognizer_scores
from drape.gates.recognizers.dlib_face import DRIFT_DISTANCE, DlibRecognizer
from drape.gates.suites.calibration import redrawn_lower_bounds
from drape.gates.suites.harmless import suite
from drape.gates.suites.regressions import LOOK_ALIKE
from drape.gates.verdict.report import bootstrap_lower_bound

CHECK_OF = {
    "dlib": "identity",
    "dlib+drift": "identity",
    "pixel": "identity",
    "ocr": "texture",
    "tesseract": "texture",
    "glyph": "texture",
    "glyph+ocr": "texture",
}
RULES = ("dlib", "dlib+drift", "ocr", "tesseract")  # per-sample rules in the recognizer's own terms; the others are thresholded
# the per-sample thresholds of the value ways (pixel, glyph): the harmless floor over the first
# CALIBRATION samples of each harmless kind (those of the 40-sample runs), less MARGIN; samples after
# them are held apart from the calibration
CALIBRATION, MARGIN = 40, 0.02
DRIFTS = ("face: eyes set closer", "face: lower face squashed")


def _misprint(word: str, kind: str) -> str:
    if kind == "look-alike":
        look = {**LOOK_ALIKE, "L": "I", "E": "F", "S": "5", "N": "M", "I": "l", "T": "I", "Y": "V", "9": "8", "$": "S"}
        index = next((i for i, c in enumerate(word) if c in look), 0)
        return word[:index] + look.get(word[index], "X") + word[index + 1 :]
    if kind == "last lost":
        return word[:-1]
    digits = [i for i, c in enumerate(word) if c.isdigit()]
    index = digits[0] if digits else len(word) // 2
    return (
        word[:index]
        + ("7" if word[index].isdigit() and word[index] != "7" else "K" if word[index] != "K" else "H")
        + word[index + 1 :]
    )


def regressions(control: dict, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """{check: {kind: outputs}}: the control targets with one regression each."""
    rng = np.random.default_rng(seed)
    targets, meta = control["target"], control["meta"]
    scenes = [FaceScene(t, tuple(m["face_box"]), m["person"]) for t, m in zip(targets, meta)]  # type: ignore[arg-type]
    other = {"astronaut": "hopper", "hopper": "astronaut"}

    def each(edit) -> np.ndarray:
        return np.stack([edit(scene, m) for scene, m in zip(scenes, meta)])

    text = {
        f"text: {kind}": each(
            lambda s, m, kind=kind: print_word(s.image, _misprint(m["word"], kind), m["logo_box"], tuple(m["ink"]))
        )
        for kind in ("look-alike", "last lost", "one changed")
    }
    return {
        "identity": {
            "face: another person": each(lambda s, m: swap_face(s, other[s.person])),
            "face: covered (no face)": each(lambda s, m: erase_face(s, rng)),
            "face: eyes set closer": each(lambda s, m: drift_face(s, 0.3, 0.55, 0.75, 1)),
            "face: lower face squashed": each(lambda s, m: drift_face(s, 0.55, 1.0, 0.75, 0)),
        },
        "texture": text,
    }


def score_all(control: dict, outputs: np.ndarray, tools: dict, timing: dict) -> dict[str, np.ndarray]:
    """Per way, per-sample values of `outputs` against the control targets (NaN: no face found / no text)."""
    targets, keys = control["target"], control["keys"]
    faces, logos = [m["face_box"] for m in control["meta"]], [m["logo_box"] for m in control["meta"]]
    values = {}
    for way, run in (
        ("dlib", lambda: dlib_values(tools["dlib"], outputs, targets, faces, keys, values)),
        ("pixel", lambda: identity_scores(outputs, targets, faces, tools["pixel"])),
        ("ocr", lambda: tools["ocr"].scores(outputs, targets, logos, keys)),
        ("tesseract", lambda: tools["tesseract"].scores(outputs, targets, logos, keys)),
        ("glyph", lambda: texture_scores(outputs, targets, logos, 2)),
    ):
        started = time.perf_counter()
        values[way] = np.asarray(run(), dtype=np.float64)
        timing.setdefault(way, []).append((time.perf_counter() - started) / len(outputs))
    return values


def dlib_values(check, outputs: np.ndarray, targets: np.ndarray, faces: list, keys: list, values: dict) -> np.ndarray:
    """dlib's similarities; its drift distances into `values['drift']` (one pass: both descriptors)."""
    matches = check.matches(outputs, targets, faces, keys)
    values["drift"] = drift_values(matches)
    return recognizer_scores(matches)


def per_sample_failures(way: str, values: dict[str, np.ndarray], thresholds: dict[str, float]) -> np.ndarray:
    """bool per sample: the way calls it a regression."""
    if way == "dlib":
        v = values["dlib"]
        return ~np.isfinite(v) | (np.nan_to_num(v, nan=0.0) < 0.4)
    if way == "dlib+drift":
        return per_sample_failures("dlib", values, thresholds) | (np.nan_to_num(values["drift"], nan=0.0) > DRIFT_DISTANCE)
    if way in ("ocr", "tesseract"):
        return np.nan_to_num(values[way], nan=1.0) < 1.0 - 1e-9
    if way == "glyph+ocr":
        return per_sample_failures("ocr", values, thresholds) | per_sample_failures("glyph", values, thresholds)
    return values[way] < thresholds[way]


def gate_rates(way: str, values: dict, thresholds: dict, gate: dict, redraws: int, max_share: float, seed: int) -> float:
    """Share of redrawn control sets the gate fails on this kind, for `way`."""
    failing = per_sample_failures(way, values, thresholds).astype(np.float64)
    picks = np.random.default_rng(seed).integers(0, len(failing), size=(redraws, len(failing)))
    share = {"dlib": max_share, "dlib+drift": max_share, "ocr": OCR_SHARE, "tesseract": OCR_SHARE, "glyph+ocr": OCR_SHARE}.get(
        way
    )
    broken = failing[picks].mean(axis=1) > share + 1e-9 if share is not None else np.zeros(redraws, bool)
    for value_way in VALUE_WAYS[way]:  # the same redrawn sets: each value check's lower bound on each
        low = np.array([bootstrap_lower_bound(values[value_way][pick], resamples=500, seed=i) for i, pick in enumerate(picks)])
        broken |= ~(low >= gate[value_way])  # NaN (no face in any sample) fails
    return float(broken.mean())


# the value checks each way's gate applies (the lower bound of the mean against its threshold)
VALUE_WAYS = {
    "dlib": ("dlib",),
    "dlib+drift": ("dlib",),
    "pixel": ("pixel",),
    "ocr": ("ocr",),
    "tesseract": ("tesseract",),
    "glyph": ("glyph",),
    "glyph+ocr": ("glyph", "ocr"),
}
# OCR misreads a few percent of harmless samples (a letter of a 10-20 px word under a median filter):
# at the gate its per-sample rule is a backstop and the lower bound of the mean decides
OCR_SHARE = 0.25


def measure(size: int, samples: int, seed: int, false_alarm: float, redraws: int, max_share: float, tools: dict, timing: dict):
    """(rows {kind: (check or 'harmless', {way: (per-sample rate, gate rate)})}, margins) at `size` px."""
    control = real_control(size, samples, seed)
    targets, meta = control["target"], control["meta"]
    kinds = {name: ("harmless", variant(targets, meta, np.random.default_rng(seed))) for name, variant in suite("wide").items()}
    for check, found in regressions(control, seed).items():
        kinds.update({name: (check, outputs) for name, outputs in found.items()})
    scored = {name: (check, score_all(control, outputs, tools, timing)) for name, (check, outputs) in kinds.items()}
    harmless = [values for check, values in scored.values() if check == "harmless"]
    per_sample = {way: min(float(np.min(v[way][:CALIBRATION])) for v in harmless) - MARGIN for way in ("pixel", "glyph")}
    gate = {
        way: min(
            float(np.nanquantile(redrawn_lower_bounds(v[way], redraws=redraws, seed=seed), false_alarm, method="inverted_cdf"))
            for v in harmless
        )
        for way in ("dlib", "pixel", "glyph", "ocr", "tesseract")
    }
    rows = {}
    for name, (check, values) in scored.items():
        ways = [way for way in CHECK_OF if check in ("harmless", CHECK_OF[way])]
        rows[name] = (
            check,
            {
                way: (
                    float(per_sample_failures(way, values, per_sample).mean()),
                    gate_rates(way, values, per_sample, gate, redraws, max_share, seed),
                )
                for way in ways
            },
        )
    return rows, margins(scored, gate)


def margins(scored: dict, gate: dict) -> dict[str, tuple[float, float, str, float]]:
    """Per value way: (harmless floor: the lowest lower bound of a harmless kind, the weakest regression's
    lower bound, its kind, the gap between them); and the rules' margins in their own terms."""
    out = {}
    for way in ("dlib", "pixel", "glyph", "ocr", "tesseract"):
        check = CHECK_OF[way]
        floor = min(bootstrap_lower_bound(v[way]) for c, v in scored.values() if c == "harmless")
        weakest = max(
            ((bootstrap_lower_bound(v[way]), n) for n, (c, v) in scored.items() if c == check),
            key=lambda x: np.nan_to_num(x[0], nan=-1),
        )
        out[way] = (floor, weakest[0], weakest[1], floor - weakest[0])
    harmless_distance = np.concatenate([1 - v["dlib"][np.isfinite(v["dlib"])] for c, v in scored.values() if c == "harmless"])
    drifts = np.concatenate([v["drift"] for n, (c, v) in scored.items() if n in DRIFTS])
    harmless_drift = np.concatenate([v["drift"][np.isfinite(v["drift"])] for c, v in scored.values() if c == "harmless"])
    out[f"dlib drift distance (rule {DRIFT_DISTANCE})"] = (
        float(np.max(harmless_drift)),
        float(np.nanmin(drifts)),
        "face: eyes set closer / lower face squashed (max harmless vs min)",
        float(np.nanmin(drifts) - np.max(harmless_drift)),
    )
    swapped = scored["face: another person"][1]["dlib"]
    out["dlib distance (rule 0.6)"] = (
        float(np.quantile(harmless_distance, 0.99)),
        float(np.min(1 - swapped[np.isfinite(swapped)])) if np.isfinite(swapped).any() else float("nan"),
        "face: another person (p99 harmless vs min)",
        float(np.min(1 - swapped[np.isfinite(swapped)]) - np.quantile(harmless_distance, 0.99))
        if np.isfinite(swapped).any()
        else float("nan"),
    )
    return out


def _cell(rate: float, must_fail: bool) -> str:
    text = f"{rate:.0%}" if must_fail else f"{rate:.1%}"
    good = rate >= 0.99 if must_fail else rate <= 0.01
    return text if good else f"[red]{text}[/red]"


def run(
    samples: int, resolutions: list[int], false_alarm: float, redraws: int = 200, max_share: float = 0.01, seed: int = 0
) -> None:
    """Measure and print the tables (see the module docstring)."""
    console = Console(width=240)
    tools = {
        "dlib": RecognizerCheck(DlibRecognizer(max_drift=DRIFT_DISTANCE)),
        "pixel": PixelFaceEmbedder(),
        "ocr": shared_text_check("rapidocr"),
        "tesseract": shared_text_check("tesseract"),
    }
    results, margin_rows, timing = {}, {}, {}
    for size in resolutions:
        started = time.perf_counter()
        results[size], margin_rows[size] = measure(
            size, samples, seed, false_alarm, redraws, max_share, tools, timing.setdefault(size, {})
        )
        console.print(f"{size} px: {time.perf_counter() - started:.0f} s for {samples} samples per kind", highlight=False)
    table = Table(
        title=f"real images, {samples} samples per kind: per sample / at the gate ({redraws} redrawn control sets of {samples}); "
        "red: detection under 99% or false alarms over 1%"
    )
    table.add_column("check")
    table.add_column("kind")
    for size in resolutions:
        for way in CHECK_OF:
            table.add_column(f"{size} px {way}", justify="right")
    for name, (check, _) in results[resolutions[0]].items():
        cells = []
        for size in resolutions:
            rates = results[size][name][1]
            for way in CHECK_OF:
                cells.append("" if way not in rates else " / ".join(_cell(r, check != "harmless") for r in rates[way]))
        table.add_row(check, name, *cells)
    console.print(table)
    margin_table = Table(
        title="margins: the harmless floor (lowest lower bound of a harmless kind) vs the weakest regression's lower bound"
    )
    for column in ("way", "px", "harmless floor", "weakest regression", "kind", "gap"):
        margin_table.add_column(column)
    for size, found in margin_rows.items():
        for way, (floor, weakest, kind, gap) in found.items():
            margin_table.add_row(
                way, str(size), f"{floor:.3f}", f"{weakest:.3f}", kind, f"{gap:+.3f}" if gap > 0 else f"[red]{gap:+.3f}[/red]"
            )
    console.print(margin_table)
    time_table = Table(title="time per sample on this CPU (median over kinds), ms")
    time_table.add_column("recognizer")
    for size in resolutions:
        time_table.add_column(f"{size} px", justify="right")
    for way in ("dlib", "pixel", "ocr", "tesseract", "glyph"):
        time_table.add_row(way, *(f"{np.median(timing[size][way]) * 1000:.1f}" for size in resolutions))
    console.print(time_table)
