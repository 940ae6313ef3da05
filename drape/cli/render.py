"""The one renderer of the `drape` command's reports: the run summary, storage tables, sizes.

Sizes are spelled by `drape.format_bytes` everywhere (binary units); gate reports by
`drape.gates.render`.
"""

from __future__ import annotations

from rich.panel import Panel
from rich.table import Table

from drape import format_bytes
from drape.cli.common import console

CHECKS = ("identity", "texture", "coherence")


def _check_cell(check: dict) -> str:
    threshold = "not set" if check["threshold"] is None else f"{check['threshold']:.2f}"
    colour = "green" if check["passed"] else "red"
    return f"[{colour}]{check['value']:.3f}[/{colour}] ≥ {threshold}"  # value: the bootstrap lower bound


def print_summary(summary: dict, wall_seconds: float | None = None) -> None:
    """The end-of-run table and where to look next."""
    table = table_of(
        f"drape run {summary['run_name']}",
        ("stage", "steps", "final loss", "train s", "data wait", *CHECKS, "verdict", "snapshot", "archived", "live left"),
        left=("stage", "verdict"),
    )
    for row in summary["stages"]:
        table.add_row(
            row["stage"],
            str(row["steps"]),
            f"{row['final_loss']:.4f}",
            f"{row['train_seconds']:.1f}",
            f"{100 * row['data_wait_fraction']:.2f}%",
            *(_check_cell(row["checks"][name]) for name in CHECKS),
            "[green]pass[/green]" if row["verdict"] == "pass" else "[red]FAIL[/red]",
            f"v{row['version']}",
            format_bytes(row["archived_bytes"]),
            format_bytes(row["live_bytes"]),
        )
    console.print(table)
    uri = summary["tracking_uri"]
    lines = [
        f"MLflow tracking URI: {uri}",
        f"  browse it: mlflow ui --backend-store-uri {uri}",
        f"Object store: {summary['object_store']}",
        f"Gate reports: {summary['gate_reports']}",
        f"Live storage left: {format_bytes(summary['live_bytes'])}",
    ]
    if wall_seconds is not None:
        lines.append(f"Wall time: {wall_seconds:.0f} s")
    console.print(Panel("\n".join(lines), title="where to look", expand=False))


def table_of(title: str, columns, *, left=None) -> Table:
    """A table with `columns`, numbers right-aligned (all but `left`; default: all left-aligned)."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if left is None or column in left else "right")
    return table


def lifecycle_table(title: str, rules: list[dict]) -> Table:
    """Bucket lifecycle rules as S3 returns them."""
    table = table_of(title, ("rule", "prefix", "tags", "expires after"))
    for rule in rules:
        selector = rule["Filter"].get("And", rule["Filter"])
        tags = ", ".join(f"{t['Key']}={t['Value']}" for t in selector.get("Tags", []))
        expires = (
            f"{rule['Expiration']['Days']} days"
            if "Expiration" in rule
            else f"noncurrent versions after {rule['NoncurrentVersionExpiration']['NoncurrentDays']} days"
        )
        table.add_row(rule["ID"], selector.get("Prefix", ""), tags, expires)
    return table


def print_storage_report(report: dict) -> None:
    table = table_of("storage", ("where", "kind / outcome / class", "bytes"))
    for kind, size in sorted(report["live_bytes"].items()):
        table.add_row("live", kind, format_bytes(size))
    for key, size in report["archived_bytes"].items():
        table.add_row("archive", key, format_bytes(size))
    console.print(table)
    cost = report["monthly_cost_usd"]
    console.print(f"modelled monthly cost: live ${cost['live']:.4f} + archive ${cost['archive']:.4f} = ${cost['total']:.4f}")
    for item in report["expires_next"]:
        console.print(f"expires {item['expires_at'][:10]}: {item['key']} ({format_bytes(item['bytes'])})")
