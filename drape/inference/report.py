"""The inference benchmark's report: one row per isolated run, as JSON, Markdown and a rich table."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from drape.inference.quality import Quality
from drape.jsonfile import read_json_object
from drape.secrets import redact

COLUMNS = (
    "variant",
    "what",
    "denoise median / p90",
    "end-to-end median",
    "speed-up",
    "peak memory",
    "overlap",
    "density",
    "attention cos (min)",
    "identity / texture / coherence",
    "approved",
)


def _p90(values: list[float]) -> float:
    return float(np.percentile(values, 90))


def overlap(alone_s: float, together_s: float, count: int) -> float:
    """1 − (time for `count` together) / (`count` × time alone): 0 when they queue, → 1 when free."""
    return 1.0 - together_s / (count * alone_s)


def _overlaps(result: dict, alone_s: float) -> dict[str, float]:
    together = result.get("together_s") or {}
    return {n: overlap(alone_s, s, int(n)) for n, s in together.items() if n.isdigit()}


def _peak_ratio(peaks: list[int] | None, base_peaks: list[int] | None) -> float | None:
    """The variant's median peak over the reference's; None where either is unmeasured or the
    reference's is 0 (a tiny model's request on the CPU can grow the resident set by nothing)."""
    if not peaks or not base_peaks or statistics.median(base_peaks) <= 0:
        return None
    return statistics.median(peaks) / statistics.median(base_peaks)


def variant_row(name: str, result: dict, reference: dict, quality: Quality | None, reasons: list[str]) -> dict:
    """One run's row: timings, memory, concurrency, quality and the verdict (the reference is the yardstick)."""
    row = {
        "name": name,
        "role": result.get("role"),
        "describe": result.get("describe", ""),
        "status": result.get("status", "failed"),
        "reason": redact(result.get("reason") or ""),
        "spec": result.get("spec"),
    }
    if row["status"] != "measured":
        return {**row, "approved": False, "why": row["reason"]}
    denoise, total = result["denoise_s"], result["total_s"]
    base = result.get("paired_reference") or reference  # the reference's requests in this variant's turns
    peaks, base_peaks = result.get("peak_bytes"), reference.get("peak_bytes")
    row.update(
        steps=result["steps"],
        denoise_median_s=statistics.median(denoise),
        denoise_p90_s=_p90(denoise),
        total_median_s=statistics.median(total),
        total_p90_s=_p90(total),
        requests=len(denoise),
        speedup=statistics.median(base["denoise_s"]) / statistics.median(denoise),
        paired=base is not reference,
        peak_bytes=int(statistics.median(peaks)) if peaks else None,
        peak_ratio=_peak_ratio(peaks, base_peaks),
        overlap=_overlaps(result, statistics.median(total)),
        together_note=(result.get("together_s") or {}).get("skipped"),
        density=result.get("density"),
        quality=quality.to_dict() if quality else None,
        surroundings=result.get("surroundings"),
    )
    if row["role"] == "reference":
        return {**row, "approved": True, "why": "the reference"}
    if row["role"] == "repeat":
        return {**row, "approved": None, "why": "repeatability of the stick"}
    return {**row, "approved": not reasons, "why": "; ".join(reasons) or "within the noise floor"}


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def _cells(row: dict) -> list[str]:
    if row["status"] != "measured":
        return [row["name"], row["describe"], row["status"], "-", "-", "-", "-", "-", "-", "-", "-"]
    quality = row.get("quality") or {}
    checks = quality.get("checks") or {}
    attention = quality.get("attention_min")
    overlap = ", ".join(f"×{n} {v:+.0%}" for n, v in row["overlap"].items()) or (row.get("together_note") and "n/a") or "-"
    approved = {True: "yes", False: "no", None: "-"}[row["approved"]]
    return [
        row["name"],
        row["describe"],
        f"{1000 * row['denoise_median_s']:.1f} / {1000 * row['denoise_p90_s']:.1f} ms",
        f"{1000 * row['total_median_s']:.1f} ms",
        f"{row['speedup']:.2f}×",
        _bytes(row["peak_bytes"]) + (f" ({row['peak_ratio']:.2f}×)" if row.get("peak_ratio") else ""),
        overlap,
        "-" if row["density"] is None else str(row["density"]),
        "-" if attention is None else f"{attention:.6f}",
        " / ".join(f"{checks[c]:.3f}" for c in ("identity", "texture", "coherence") if c in checks) or "-",
        approved,
    ]


def footnotes(rows: list[dict]) -> list[str]:
    """Why each variant was skipped, failed or not approved (one line each, under the table)."""
    return [f"{row['name']}: {row['status']}: {row['why']}" for row in rows if row["approved"] is False]


@dataclass
class BenchReport:
    bench_id: str
    model: str
    model_version: str | None
    checkpoint: str
    home: str  # where the model's inference.json goes
    control_set: str
    inputs: int
    settings: dict
    surroundings: dict
    floor_source: str
    floor: dict
    thresholds: dict
    rows: list[dict] = field(default_factory=list)
    created: str = ""

    def row(self, name: str) -> dict:
        return next(r for r in self.rows if r["name"] == name)

    def recommended(self) -> dict:
        """The fastest approved variant faster than the reference; else the reference."""
        approved = [r for r in self.rows if r["role"] == "variant" and r["approved"] and r["speedup"] > 1.0]
        return max(approved, key=lambda r: r["speedup"]) if approved else self.row("reference")

    def repeatability(self) -> float | None:
        """How far apart the reference's two isolated runs put its denoise median, as a share:
        |1 − speed-up of the repeat over the reference| (in its turns, when interleaved)."""
        repeat = next((r for r in self.rows if r["role"] == "repeat" and r["status"] == "measured"), None)
        return None if repeat is None else abs(1.0 - repeat["speedup"])

    def to_dict(self) -> dict:
        return {**asdict(self), "recommended": self.recommended()["name"], "repeatability": self.repeatability()}

    def headline(self) -> list[str]:
        where = self.surroundings
        device = f"{where.get('name', '?')}" + (f", load {where['load_1m']}" if "load_1m" in where else "")
        exclusive = "an exclusive device from the queue" if where.get("exclusive") else "not through the queue"
        repeat = self.repeatability()
        turns = "in turns with the reference" if any(r.get("paired") for r in self.rows) else "one after another"
        limits = ", ".join(f"{k} ≥ {v:.4f}" for k, v in self.thresholds["checks"].items())
        attention = self.thresholds["attention_min"]
        return [
            f"model {self.model} on {self.inputs} captured inputs ({self.control_set}), seed {self.settings['seed']}, "
            f"{self.settings['warmup']} warm-up + {self.settings['runs']}+ timed requests one at a time; "
            f"device {device}; {exclusive}",
            f"noise floor: {self.floor_source}; approved when attention cos ≥ "
            + ("-" if attention is None else f"{attention:.6f}")
            + f", {limits}",
            f"isolated runs {turns}; repeatability (the reference in two isolated runs): "
            + ("not measured" if repeat is None else f"denoise medians {100 * repeat:.1f}% apart"),
            f"recommended: {self.recommended()['name']}",
        ]

    def markdown(self) -> str:
        lines = [f"# Inference benchmark `{self.bench_id}`", ""] + [f"- {line}" for line in self.headline()] + [""]
        lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(cell.replace("|", "/") for cell in _cells(row)) + " |" for row in self.rows]
        notes = footnotes(self.rows)
        return "\n".join(lines + ([""] + [f"- {note}" for note in notes] if notes else []))

    def rich_table(self):
        from rich.table import Table

        table = Table(title=f"inference benchmark {self.bench_id}: {self.model}")
        for column in COLUMNS:
            table.add_column(column, justify="left" if column in ("variant", "what", "approved") else "right")
        for row in self.rows:
            cells = _cells(row)
            if row["approved"] is False:
                cells[-1] = f"[red]{cells[-1] if row['status'] == 'measured' else row['status']}[/red]"
            table.add_row(*cells)
        return table

    def write(self, directory: Path) -> None:
        for name, text in (("report.json", json.dumps(self.to_dict(), indent=2)), ("table.md", self.markdown())):
            temporary = directory / f".{name}.tmp"
            temporary.write_text(text)
            temporary.replace(directory / name)

    @classmethod
    def read(cls, path: Path) -> BenchReport:
        data = read_json_object(path, "report")
        return cls(**{k: v for k, v in data.items() if k not in ("recommended", "repeatability")})
