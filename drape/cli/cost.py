"""`drape cost report | compare | fleet | scaling | estimate`: what runs and idle capacity cost."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from drape.cli.common import ConfigOption, Typer, console, fail, finite, load
from drape.cli.render import hours, print_cost_compare, print_cost_report, table_of, usd

app = Typer(help="What runs cost: GPU-hours and their overheads, storage, egress; idle capacity.", no_args_is_help=True)
PLAN_HELP = "on-demand | reserved | burst (default cost.plan)"


def _latest_run(cfg) -> str:
    """The newest pipeline run (an MLflow parent run) of the config's experiment."""
    from drape.ops.tracking import Tracker

    tracker = Tracker(cfg)
    for found in tracker.client.search_runs([tracker.experiment_id], order_by=["attributes.start_time DESC"], max_results=50):
        if "drape.run_id" in found.data.tags and "drape.stage" not in found.data.tags:
            return found.data.tags["drape.run_id"]
    fail(f"no pipeline run in MLflow experiment {cfg.tracking.experiment!r} at {cfg.tracking_uri}: give a RUN id")


def _attempts(cfg, run_id: str) -> list:
    """The run's jobs' GPU allocations from the queue (none when it trained in-process)."""
    from scheduler.dispatch.accounting import run_attempts
    from scheduler.queue.store import JobStore

    return run_attempts(JobStore(cfg.queue_url), run_id, cfg)


def _check_plans(plans: list[str]) -> list[str]:
    from drape.config import PLANS

    for plan in plans:
        if plan not in PLANS:
            fail(f"plan {plan!r} unknown; expected one of {', '.join(PLANS)}")
    return plans


@app.command("report")
def cost_report(
    run_id: str | None = typer.Argument(None, help="run id (default: the newest run of the config)"),
    config: Path | None = ConfigOption,
    plan: str | None = typer.Option(None, help=PLAN_HELP),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """A run's cost: GPU-hours by what they went to, storage, requests, egress; per stage and checkpoint.

    GPU time splits into training, data wait, checkpoint stall, start-up, shutdown, failed attempts,
    gate sampling and between stages; the rows add up to the allocated GPU-hours."""
    from drape.cost import CostError
    from drape.cost.report import run_report
    from drape.storage.store import open_store

    cfg = load(config)
    run_id = run_id or _latest_run(cfg)
    try:
        report = run_report(cfg, open_store(cfg), run_id, _attempts(cfg, run_id), plan=_check_plans([plan])[0] if plan else None)
    except CostError as error:
        fail(str(error))
    if as_json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print_cost_report(report)


@app.command("compare")
def cost_compare(
    run_id: str = typer.Argument(..., help="run id"),
    config: Path | None = ConfigOption,
    plan: list[str] = typer.Option(["on-demand", "reserved", "burst"], help="a plan to price the run under (repeat)"),
) -> None:
    """The same run priced under several plans, side by side."""
    from drape.cost import CostError
    from drape.cost.report import compare
    from drape.storage.store import open_store

    cfg = load(config)
    try:
        reports = compare(cfg, open_store(cfg), run_id, _attempts(cfg, run_id), _check_plans(plan))
    except CostError as error:
        fail(str(error))
    print_cost_compare(reports)


@app.command("fleet")
def cost_fleet(
    config: Path | None = ConfigOption,
    window_hours: float = typer.Option(
        24.0, "--hours", parser=finite("--hours", 0.001), help="the window: the last this many hours"
    ),
) -> None:
    """Reserved GPU-hours the queue's fleet left idle over the window, priced at cost.fleet_plan."""
    from drape.cost import CostError
    from drape.cost.fleet import idle_cost
    from scheduler.dispatch.accounting import fleet_log
    from scheduler.queue.store import JobStore

    cfg = load(config)
    inventory, events = fleet_log(JobStore(cfg.queue_url))
    if not inventory:
        fail(f"the queue at {cfg.queue_url.split('@')[-1]} knows no GPUs yet: run `drape queue dispatch` once")
    now = time.time()
    try:
        fleet = idle_cost(cfg.cost, inventory, events, now - window_hours * 3600, now)
    except CostError as error:
        fail(str(error))
    console.print(f"fleet, last {window_hours:g} h, idle hours priced {fleet['plan']}")
    table = table_of(
        "fleet",
        ("model", "GPUs", "allocated GPU-h", "idle GPU-h", "idle", "cost of idle"),
        left=("model",),
    )
    for row in fleet["models"]:
        table.add_row(
            row["model"],
            str(row["gpus"]),
            hours(row["allocated_gpu_hours"]),
            hours(row["idle_gpu_hours"]),
            f"{100 * row['idle_share']:.1f}%",
            usd(row["idle_usd"]),
        )
    console.print(table)
    console.print(
        f"idle capacity cost {usd(fleet['idle_usd'])} over {window_hours:g} h ({hours(fleet['idle_gpu_hours'])} GPU-hours)"
    )


@app.command("scaling")
def cost_scaling(
    config: Path | None = ConfigOption,
    stage: str = typer.Option("identity", help="the stage whose job is measured"),
    ranks: list[int] = typer.Option([1, 2], help="rank counts to measure (repeat; 1 is always measured)"),
    steps: int = typer.Option(30, min=2, help="steps per measurement"),
    repeats: int = typer.Option(1, min=1, help="runs per rank count (the median is kept)"),
) -> None:
    """Measure the stage job's throughput at each rank count under torchrun and record its scaling efficiency."""
    from drape.cost.scaling import measure
    from drape.storage.store import open_store

    cfg = load(config)

    def point(count: int, throughput: float) -> None:
        console.print(f"{count} rank(s): {throughput:.1f} samples/s")

    try:
        record = measure(cfg, open_store(cfg), stage=stage, ranks=tuple(ranks), steps=steps, repeats=repeats, on_point=point)
    except (RuntimeError, ValueError) as error:
        fail(str(error))
    table = table_of(f"scaling of {cfg.name}/{stage} on {record['device']}", ("ranks", "samples/s", "efficiency"))
    for count, value in record["throughput"].items():
        table.add_row(count, f"{value:.1f}", f"{record['efficiency'][count]:.2f}")
    console.print(table)


@app.command("estimate")
def cost_estimate(
    config: Path | None = ConfigOption,
    like: str = typer.Option(..., help="a measured run whose overheads the modelled run takes"),
    like_config: Path | None = typer.Option(None, help="the measured run's config (default: --config)"),
    step_seconds: float | None = typer.Option(
        None, parser=finite("--step-seconds", 0.0), help="wall seconds per step (default: the queue's estimate)"
    ),
    efficiency: float = typer.Option(
        1.0, parser=finite("--efficiency", 0.01, 1.0), help="scaling efficiency on the config's GPUs"
    ),
    model: str = typer.Option("NVIDIA H100 80GB HBM3", help="the GPU model the config runs on"),
) -> None:
    """A modelled run of the config, priced under every plan.

    Training: each stage's steps × `--step-seconds` (else the queue's compute estimate), divided by
    `--efficiency`. Overheads from the measured run `--like`: data wait and checkpoint stall as
    shares of its training loop, start-up, shutdown, gate and between stages as seconds per stage."""
    from drape import STAGES, JobKind
    from drape.cost import CostError
    from drape.cost.report import modelled, overheads_of, run_report
    from drape.storage.store import open_store
    from scheduler.jobs.profiles import estimate

    cfg, measured_cfg = load(config), load(like_config or config)
    try:
        measured = run_report(measured_cfg, open_store(measured_cfg), like, _attempts(measured_cfg, like))
        gpus = max(cfg.train.gpus_for(stage) for stage in STAGES)
        training = {
            str(s): (
                cfg.train.stages[s].steps * step_seconds
                if step_seconds is not None
                else estimate(cfg, JobKind.STAGE_TRAINING, s, cfg.train.gpus_for(s))[1]
            )
            / 3600
            / efficiency
            for s in STAGES
        }
        result = modelled(cfg.cost, training, gpus, model, overheads_of(measured))
    except CostError as error:
        fail(str(error))
    source = f"{step_seconds:g} s/step" if step_seconds is not None else "the queue's compute estimate"
    console.print(
        f"modelled {cfg.name} run: {gpus} × {model}, training at {source}, efficiency {efficiency:g}, overheads of run {like}"
    )
    table = table_of(f"modelled {cfg.name} run", ("GPU time", "GPU-hours", "share"), left=("GPU time",))
    for name, value in result["rows"].items():
        table.add_row(name, hours(value), f"{100 * value / result['allocated_gpu_hours']:.2f}%")
    table.add_row("[bold]allocated[/bold]", hours(result["allocated_gpu_hours"]), "100.0%")
    console.print(table)
    console.print(
        f"wall {result['wall_hours']:.1f} h; " + ", ".join(f"{plan} {usd(value)}" for plan, value in result["usd"].items())
    )
