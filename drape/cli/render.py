"""The one renderer of the `drape` command's reports: the run summary, storage tables, sizes.

Sizes are spelled by `drape.format_bytes` everywhere (binary units); gate reports by
`drape.gates.verdict.render`.
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
    cost = summary.get("cost") or {}
    if "total_usd" in cost:
        lines.append(
            f"Cost: {usd(cost['total_usd'])} (GPU {usd(cost['gpu']['usd'])}, {100 * cost['gpu']['not_training_share']:.0f}% "
            f"not training; storage {usd(cost['storage']['usd'])}): drape cost report {summary['run_id']}"
        )
    elif cost:
        lines.append(f"Cost: not worked out ({cost.get('error')})")
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


def usd(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.0f}" if abs(value) >= 100 else f"${value:,.2f}" if abs(value) >= 1 else f"${value:.4f}"


def hours(value: float) -> str:
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.4f}"


def print_cost_report(report: dict) -> None:
    """GPU-hours by category, per stage, storage, the total, per promoted checkpoint, other GPU counts."""
    models = ", ".join(sorted(set(report["models"].values()))) or "?"
    gpu = report["gpu"]
    console.print(
        f"run {report['run_id']}: {report['gpus']} × {models}, priced {report['plan']}, wall {report['wall_hours']:.3f} h "
        f"in {report['segments']} segment(s)"
    )
    if times := report.get("job_times"):
        console.print(f"job times from {times['source']}: {times['why']}")
    table = table_of(
        "GPU time",
        ("GPU time", "GPU-hours", "cost", "share"),
        left=("GPU time",),
    )
    for row in gpu["rows"]:
        if row["gpu_hours"] or row["category"] in ("training", "data wait", "checkpoint stall", "start-up", "gate sampling"):
            table.add_row(row["category"], hours(row["gpu_hours"]), usd(row["usd"]), f"{100 * row['share']:.1f}%")
    table.add_row("[bold]allocated[/bold]", hours(gpu["allocated_gpu_hours"]), usd(gpu["usd"]), "100.0%")
    console.print(table)
    storage = report["storage"]
    rows = table_of("storage", ("item", "amount", "cost"), left=("item", "amount"))
    for name, row in storage["archived"].items():
        rows.add_row(f"archived {name}", f"{format_bytes(row['bytes'])}, {row['gb_months']:.4f} GB-months", usd(row["usd"]))
    rows.add_row("live while running", f"{storage['live']['gb_months']:.6f} GB-months", usd(storage["live"]["usd"]))
    rows.add_row("registry (baselines)", f"{storage['registry']['gb_months']:.4f} GB-months", usd(storage["registry"]["usd"]))
    requests = storage["requests"]
    rows.add_row("requests", f"{requests['put']} PUT, {requests['get']} GET", usd(requests["usd"]))
    rows.add_row("egress", format_bytes(storage["egress"]["bytes"]), usd(storage["egress"]["usd"]))
    console.print(rows)
    stages = table_of("per stage", ("stage", "GPU-hours", "GPU", "storage", "total", "promoted"), left=("stage", "promoted"))
    for row in report["stages"]:
        promoted = "yes" if row["promoted"] else "[red]no[/red]"
        stages.add_row(
            row["stage"], hours(row["gpu_hours"]), usd(row["gpu_usd"]), usd(row["storage_usd"]), usd(row["usd"]), promoted
        )
    console.print(stages)
    per_run = report["per_promoted_checkpoint"]["run"]
    console.print(
        f"total {usd(report['total_usd'])} (GPU {usd(gpu['usd'])}, storage {usd(storage['usd'])}); "
        f"{100 * gpu['not_training_share']:.1f}% of the GPU-hours not training; per promoted run checkpoint: "
        + (usd(per_run) if per_run is not None else "none (not every stage was promoted)")
    )
    for line in report["what_if"]:
        console.print(
            f"on {line['gpus']} GPU(s): efficiency {line['efficiency']:.2f} (measured on {line['measured_on']}), training "
            f"{line['training_wall_hours']:.4f} h wall, {hours(line['training_gpu_hours'])} GPU-hours, {usd(line['usd'])}"
        )


def print_cost_compare(reports: dict[str, dict]) -> None:
    plans = list(reports)
    first = reports[plans[0]]
    table = table_of(f"run {first['run_id']} under each plan", ("", *plans), left=("",))
    for index, row in enumerate(first["gpu"]["rows"]):
        if row["gpu_hours"]:
            table.add_row(row["category"], *(usd(reports[p]["gpu"]["rows"][index]["usd"]) for p in plans))
    table.add_row("GPU", *(usd(reports[p]["gpu"]["usd"]) for p in plans))
    table.add_row("storage", *(usd(reports[p]["storage"]["usd"]) for p in plans))
    table.add_row("[bold]total[/bold]", *(usd(reports[p]["total_usd"]) for p in plans))
    table.add_row("per promoted run", *(usd(reports[p]["per_promoted_checkpoint"]["run"]) for p in plans))
    console.print(table)
