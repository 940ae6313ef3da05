"""A GateReport for people: one set of formatted cells per check, shown in each medium.

`check_cells` decides how every value reads (three decimals, "not set", the baseline comparison);
`markdown` (the Prefect UI artifact), `slack_lines` (the alert) and `rich_table` (`drape gate
check`) only lay those cells out, so the three never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from drape.gates.verdict.report import CheckResult, GateReport

COLUMNS = ("check", "lower bound", "mean", "min", "threshold", "nuisance floor (margin)", "baseline mean (max drop)", "verdict")


@dataclass(frozen=True)
class CheckCells:
    check: str
    lower: str
    mean: str
    minimum: str
    threshold: str
    floor: str  # "0.912 (+0.031)", or "-" when not measured
    baseline: str  # the change check: "0.880 (0.050)", or why it was skipped
    baseline_mean: str  # "" without a baseline
    verdict: str  # "pass" or "FAIL"
    passed: bool

    def row(self) -> list[str]:
        return [self.check, self.lower, self.mean, self.minimum, self.threshold, self.floor, self.baseline, self.verdict]


def _cells(check: CheckResult) -> CheckCells:
    baseline_mean = "" if check.baseline_mean is None else f"{check.baseline_mean:.3f}"
    source = ", nuisance" if check.drop_source.startswith("nuisance") else ""
    change = f"{baseline_mean} ({check.max_drop:.3f}{source})" if check.change_checked else (check.change_note or "-")
    floor = "-" if check.floor is None or check.margin is None else f"{check.floor:.3f} ({check.margin:+.3f})"
    from_floor = " (floor)" if check.threshold_source.startswith("nuisance") else ""
    unset = "off (not judged)" if check.threshold_source == "off" else "not set"
    threshold = unset if check.threshold is None else f"{check.threshold:.3f}{from_floor}"
    return CheckCells(
        check.name,
        f"{check.lower:.3f}",
        f"{check.mean:.3f}",
        f"{check.minimum:.3f}",
        threshold,
        floor,
        change,
        baseline_mean,
        "pass" if check.passed else "FAIL",
        check.passed,
    )


def check_cells(report: GateReport) -> list[CheckCells]:
    return [_cells(check) for check in report.checks.values()]


def baseline_label(report: GateReport) -> str:
    return f"v{report.baseline['version']}" if report.baseline else "none (first run)"


def markdown(report: GateReport) -> str:
    """The report as a Markdown table (the Prefect UI's gate artifact)."""
    lines = [
        f"# Gate `{report.stage}`: **{report.verdict.upper()}**",
        "",
        f"Run `{report.run_id}`, control set `{report.control_set}`, baseline {baseline_label(report)}",
        "",
    ]
    lines += [f"**{problem}**" for problem in report.provenance] + ([""] if report.provenance else [])
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells.row()) + " |" for cells in check_cells(report)]
    failures, notes = report.failures(), report.notes()
    lines += [""] + [f"- {line}" for line in failures] if failures else []
    lines += [""] + [f"- note: {line}" for line in notes] if notes else []
    return "\n".join(lines)


def slack_lines(report: GateReport) -> list[str]:
    """One mrkdwn line per provenance problem and per check (the alert's section)."""
    lines = [f":x: *{problem}*" for problem in report.provenance]
    for cells in check_cells(report):
        mark = ":white_check_mark:" if cells.passed else ":x:"
        baseline = f", baseline mean {cells.baseline_mean}" if cells.baseline_mean else ""
        floor = f", nuisance floor {cells.floor}" if cells.floor != "-" else ""
        lines.append(f"{mark} *{cells.check}*: {cells.lower} (mean {cells.mean}) vs threshold {cells.threshold}{floor}{baseline}")
    return lines


def rich_table(report: GateReport, title: str):
    """A rich Table of the checks, failing verdicts in red."""
    from rich.table import Table

    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("check", "verdict") else "right")
    for cells in check_cells(report):
        row = cells.row()
        table.add_row(*row[:-1], cells.verdict if cells.passed else f"[red]{cells.verdict}[/red]")
    return table
