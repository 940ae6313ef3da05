"""What `drape gate calibrate` sets beyond the value thresholds: the per-sample rules' settings at the
control set's resolution (a recognizer's drift limit, OCR's text rules), each from the harmless rows
with its margin stated, and the calibrated config that extends the one calibrated (`--write`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from drape.config import PipelineConfig
from drape.gates.suites.calibration import Row
from drape.gates.verdict.report import bootstrap_lower_bound


@dataclass(frozen=True)
class RuleSetting:
    """What one per-sample rule needs on this control set, at its resolution: `value` for config key
    `key`, from the harmless `level` (set by `variant`) and the stated `margin`; `weakest` is the
    nearest aimed corruption (its value and name: the margin left to what the rule must catch)."""

    key: str
    value: float
    level: float
    variant: str
    margin: float
    weakest: tuple[float, str] | None
    digits: int = 2  # decimals of `value` (a face warp, a share of the face width, needs 4)
    margin_text: str = ""  # the margin in the rule's own units, where `margin` alone would not say them

    def line(self) -> str:
        """The config line, with where the value came from."""
        shown = self.digits + 1
        caught = f"; nearest corruption {self.weakest[1]} {self.weakest[0]:.{shown}f}" if self.weakest else ""
        return (
            f"{self.key}: {self.value:.{self.digits}f}   # harmless {self.level:.{shown}f} ({self.variant}), "
            f"margin {self.margin_text or f'{self.margin:g}'}{caught}"
        )


def _ceil(value: float, digits: int = 2) -> float:
    return float(np.ceil(round(value * 10**digits, 6)) / 10**digits)


def _floor(value: float) -> float:
    return float(np.floor(round(value * 100, 6)) / 100)


def _ruled(rows: list[Row], check: str, aimed: bool) -> list[tuple[Row, np.ndarray]]:
    """(row, its rule values) of `check`'s rows (aimed corruptions or harmless ones) that measured
    the rule on some sample."""
    return [
        (r, r.rule) for r in rows if r.check == check and r.aimed == aimed and r.rule is not None and np.isfinite(r.rule).any()
    ]


def drift_setting(
    rows: list[Row], *, same_similarity: float, margin: float, key: str = "gates.identity.max_drift", digits: int = 2
) -> RuleSetting | None:
    """The drift rule's limit (`key`: dlib's `gates.identity.max_drift`, or the face warp's
    `gates.identity.max_warp` with `digits` 4): the largest per-sample drift of the same face under
    the harmless variants, plus `margin` (rounded up to `digits` decimals); None when no row measured
    drift. `weakest`: the smallest drift of an identity corruption's sample that the same-person rule
    still calls the same person (a drift only the drift rule can catch)."""
    harmless = [(float(np.nanmax(drift)), r.outputs) for r, drift in _ruled(rows, "identity", False)]
    if not harmless:
        return None
    level, variant = max(harmless)
    aimed = []
    for r, drift in _ruled(rows, "identity", True):
        keep = np.isfinite(drift) & (r.scores >= same_similarity)
        if keep.any():
            aimed.append((float(np.min(drift[keep])), r.outputs))
    weakest = min(aimed) if aimed else None
    return RuleSetting(key, _ceil(level + margin, digits), level, variant, margin, weakest, digits)


# How many misreads beyond the most a harmless variant made `max_misread_share` lets pass: a share is
# counted in samples, and a limit at the harmless count fails the next harmless misread (a zero margin)
MISREAD_MARGIN = 1


def text_settings(rows: list[Row], *, min_similarity: float, margin: float) -> list[RuleSetting]:
    """`gates.texture.min_text_lower` (the lowest bootstrap lower bound of the mean text similarity
    under the harmless variants, less `margin`, rounded down) and `gates.texture.max_misread_share`
    (the largest count of samples misread, read otherwise than the target, under a harmless variant,
    plus `MISREAD_MARGIN` misreads, as a share of the judged samples rounded up; an aimed corruption
    the margin lets pass is named in the line); `weakest`: the aimed corruption misread least often
    among those it stops. Empty when no row read text (OCR off, or no mark read in any target)."""
    harmless, aimed = _ruled(rows, "texture", False), _ruled(rows, "texture", True)
    if not harmless:
        return []
    level, variant = min((bootstrap_lower_bound(text), r.outputs) for r, text in harmless)
    nearest = max(((bootstrap_lower_bound(text), r.outputs) for r, text in aimed), default=None)
    lower = RuleSetting("gates.texture.min_text_lower", max(_floor(level - margin), 0.01), level, variant, margin, nearest)
    # every harmless row judged some mark (`_ruled` keeps rows with a finite rule value): judged >= 1
    (misread, judged), share_variant = max(
        ((misreads(text, min_similarity), r.outputs) for r, text in harmless), key=lambda m: m[0][0] / m[0][1]
    )
    shares = [(_misread(text, min_similarity), r.outputs) for r, text in aimed]
    value = _ceil(min((misread + MISREAD_MARGIN) / judged, 1.0))
    # the margin may let pass a corruption that misreads a few tags by chance (an elastic warp PP-OCR
    # misreads on 1 of 6): said, as the glyph check (`min_fidelity`) is the one that stops those
    released = sorted(s for s in shares if _ceil(misread / judged) < s[0] <= value)
    caught = min((s for s in shares if s[0] > value), default=None)
    said = f"{MISREAD_MARGIN} misread of {judged} judged"
    if released:
        said += f" (lets pass what it stopped at {misread} of {judged}: " + ", ".join(f"{n} {v:.3f}" for v, n in released) + ")"
    share, margin_share = misread / judged, MISREAD_MARGIN / judged
    return [
        lower,
        RuleSetting("gates.texture.max_misread_share", value, share, share_variant, margin_share, caught, margin_text=said),
    ]


# How far above the largest harmless warp of a sample `max_warp` is calibrated: about half the gap
# between the harmless kinds and the weakest drift measured (a 10% squash of the lower face: +0.0032
# at 256 px on 74-108 px faces, benchmarks/drift_margins.py; +0.0019 on the rehearsal's 51 px faces)
WARP_MARGIN = 0.001


def _same_similarity(identity) -> float:
    """The same-person rule as the identity check's similarity: 1 less dlib's distance, or ArcFace's cosine."""
    if identity.embedder == "dlib":
        return 1.0 - (identity.same_person or 0.6)
    from drape.gates.recognizers.arcface import SAME_PERSON_COSINE

    return SAME_PERSON_COSINE if identity.same_person is None else identity.same_person


def misreads(values: np.ndarray, min_similarity: float) -> tuple[int, int]:
    """(samples read otherwise than the target, judged samples: a target whose mark reads as text)."""
    judged = values[np.isfinite(values)]
    return int(np.sum(judged < min_similarity - 1e-9)), len(judged)


def _misread(values: np.ndarray, min_similarity: float) -> float:
    """The share of judged samples read otherwise than the target."""
    misread, judged = misreads(values, min_similarity)
    return misread / judged if judged else 0.0


def rule_settings(
    config: PipelineConfig, rows: list[Row], *, drift_margin: float, text_margin: float, warp_margin: float = WARP_MARGIN
) -> list[RuleSetting]:
    """The per-sample rules' settings (`drift_setting`, `text_settings`) these rows call for under
    `config`'s recognizer rules (dlib's same-person distance, OCR's per-sample similarity): the face
    warp's `max_warp` (with `warp_margin`) when it is the drift rule, else dlib's `max_drift`."""
    identity, texture = config.gates.identity, config.gates.texture
    settings = []
    found = None
    if identity.is_recognizer and identity.max_warp is not None:
        same = _same_similarity(identity)
        found = drift_setting(rows, same_similarity=same, margin=warp_margin, key="gates.identity.max_warp", digits=4)
    elif identity.embedder == "dlib" and identity.max_drift is not None:
        found = drift_setting(rows, same_similarity=_same_similarity(identity), margin=drift_margin)
    settings += [found] if found else []
    if texture.ocr != "off":
        settings += text_settings(rows, min_similarity=texture.min_text_similarity, margin=text_margin)
    return settings


VALUE_KEYS = {
    "identity": ("identity", "min_similarity"),
    "texture": ("texture", "min_fidelity"),
    "coherence": ("coherence", "min_score"),
}


def calibrated_overlay(
    config_path: Path, config: PipelineConfig, gate: dict[str, float], rules: list[RuleSetting], *, vs_baseline: bool
) -> dict:
    """The config that extends `config_path` with the calibrated values: each value threshold
    (rounded down to 2 decimals) unless the config's is 'nuisance' or 'off' (measured at each gate,
    or not judged), and the per-sample rules' settings."""
    gates: dict[str, dict] = {}
    for check, value in gate.items():
        section, key = VALUE_KEYS[check]
        key = "min_score_vs_baseline" if vs_baseline and check == "coherence" else key
        if getattr(getattr(config.gates, section), key) not in ("nuisance", "off"):
            gates.setdefault(section, {})[key] = _floor(value)
    for setting in rules:
        _, section, key = setting.key.split(".")
        gates.setdefault(section, {})[key] = setting.value
    return {"extends": str(Path(config_path).resolve()), "gates": gates}


def write_calibrated(
    path: Path,
    config_path: Path,
    config: PipelineConfig,
    gate: dict[str, float],
    rules: list[RuleSetting],
    *,
    vs_baseline: bool,
    note: str,
) -> None:
    """Write `calibrated_overlay` to `path` (a new file): to a temporary name, loaded back as a
    config (every value validated), then renamed; ValueError if `path` exists or does not load."""
    import os
    import tempfile

    import yaml

    from drape.config import load_config

    path = Path(path)
    if path.exists():
        raise ValueError(f"--write {path}: the file exists; name a new one")
    overlay = calibrated_overlay(config_path, config, gate, rules, vs_baseline=vs_baseline)
    header = "".join(f"# {line}\n" for line in [f"drape gate calibrate: {note}", *(s.line() for s in rules)])
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".yaml", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(header + yaml.safe_dump(overlay, sort_keys=False))
        load_config(temporary)  # the calibrated config must load: bounds, extends and every field
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
