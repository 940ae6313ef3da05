"""The cost report of a run: GPU-hours by category priced by GPU model and plan, storage, the
total, per stage, per promoted checkpoint, and what the training would cost on other GPU counts
(from measured scaling efficiency). Also the same run under several plans (`compare`) and a
modelled run of another config from a measured run's overhead shares (`modelled`)."""

from __future__ import annotations

import json
import time

from drape import STAGES
from drape.config import PipelineConfig
from drape.config.cost import CostConfig
from drape.cost import CostError, gpu_rate, timeline
from drape.cost.account import CATEGORIES, OVERHEADS, Attempt, GpuAccount, build, job_times
from drape.cost.scaling import read_scaling
from drape.cost.storage import storage_cost
from drape.pipeline.resume import ResumeError, load_progress
from drape.storage.store import ObjectStore


def run_report(
    config: PipelineConfig, store: ObjectStore, run_id: str, attempts: list[Attempt], *, plan: str | None = None
) -> dict:
    """The cost report of `run_id` (see the module docstring) as a JSON-able dict."""
    events = timeline.read(store, run_id)
    if not any(e.get("event") == "open" for e in events):
        raise CostError(
            f"run {run_id} has no cost timeline at {store.key_url(f'runs/{run_id}/cost')}: it is not a run of this "
            "config's object store, or it ran before drape recorded what runs cost"
        )
    account = build(events, attempts, time.time())
    plan = plan or config.cost.plan
    gpu = _gpu_rows(config.cost, account, plan)
    storage = storage_cost(config, store, run_id, events, account)
    promoted = _promoted(store, run_id)
    stages = [
        {
            "stage": stage,
            "gpu_hours": gpu["per_stage"][stage]["gpu_hours"],
            "gpu_usd": gpu["per_stage"][stage]["usd"],
            "storage_usd": storage["per_stage_usd"].get(stage, 0.0),
            "usd": gpu["per_stage"][stage]["usd"] + storage["per_stage_usd"].get(stage, 0.0),
            "promoted": stage in promoted,
        }
        for stage in STAGES
        if stage in gpu["per_stage"]
    ]
    total = gpu["usd"] + storage["usd"]
    return {
        "run_id": run_id,
        "plan": plan,
        "gpus": account.gpus,
        "models": account.models,
        "wall_hours": account.wall_seconds / 3600,
        "segments": len(account.segments),
        "job_times": job_times(attempts),
        "gpu": {key: value for key, value in gpu.items() if key != "per_stage"},
        "stages": stages,
        "storage": storage,
        "total_usd": total,
        "per_promoted_checkpoint": {
            **{row["stage"]: row["usd"] for row in stages if row["promoted"]},
            "run": total if set(STAGES) <= promoted else None,
        },
        "what_if": what_if(config, store, gpu, account, plan),
    }


def _gpu_rows(cost: CostConfig, account: GpuAccount, plan: str) -> dict:
    fallback = next(iter(account.models.values()), None)
    per_stage: dict[str, dict] = {}
    rows: dict[str, dict] = {category: {"category": category, "gpu_hours": 0.0, "usd": 0.0} for category in CATEGORIES}
    for (stage, category), seconds in account.seconds.items():
        model = account.models.get(stage, fallback)
        if model is None:
            raise CostError("the run's time is on GPUs no job of it ran on: no GPU model to price it by")
        hours, stage_row = seconds / 3600, per_stage.setdefault(stage, {"gpu_hours": 0.0, "usd": 0.0})
        usd = hours * gpu_rate(cost, model, plan)
        rows[category]["gpu_hours"] += hours
        rows[category]["usd"] += usd
        stage_row["gpu_hours"] += hours
        stage_row["usd"] += usd
    allocated = account.allocated_gpu_seconds / 3600
    listed = [dict(row, share=row["gpu_hours"] / allocated if allocated else 0.0) for row in rows.values()]
    return {
        "rows": listed,
        "allocated_gpu_hours": allocated,
        "usd": sum(row["usd"] for row in listed),
        "not_training_share": sum(r["gpu_hours"] for r in listed if r["category"] in OVERHEADS) / allocated if allocated else 0.0,
        "per_stage": per_stage,
    }


def _promoted(store: ObjectStore, run_id: str) -> set[str]:
    try:
        return {stage for stage, record in load_progress(store, run_id).items() if record["phase"] in ("snapshotted", "done")}
    except ResumeError:  # damaged stage records: nothing counts as promoted
        return set()


def what_if(config: PipelineConfig, store: ObjectStore, gpu: dict, account: GpuAccount, plan: str) -> list[dict]:
    """The run's training on each GPU count its shape's scaling was measured at: the training
    GPU-hours scale by efficiency(now) / efficiency(N), its wall time by (now × e(now)) / (N × e(N))."""
    scaling = read_scaling(store, config)
    if not scaling or not account.models:
        return []
    efficiency = scaling["efficiency"]
    now = str(account.gpus)
    if now not in efficiency:
        return []
    training = next(r for r in gpu["rows"] if r["category"] == "training")
    wall = training["gpu_hours"] / account.gpus
    rate = training["usd"] / training["gpu_hours"] if training["gpu_hours"] else 0.0
    lines = []
    for ranks, value in sorted(efficiency.items(), key=lambda item: int(item[0])):
        gpu_hours = training["gpu_hours"] * efficiency[now] / value
        lines.append(
            {
                "gpus": int(ranks),
                "efficiency": value,
                "training_wall_hours": wall * account.gpus * efficiency[now] / (int(ranks) * value),
                "training_gpu_hours": gpu_hours,
                "usd": gpu_hours * rate,
                "measured_on": scaling["device"],
            }
        )
    return lines


def compare(config: PipelineConfig, store: ObjectStore, run_id: str, attempts: list[Attempt], plans: list[str]) -> dict:
    """The same run priced under each of `plans`: plan → report."""
    return {plan: run_report(config, store, run_id, attempts, plan=plan) for plan in plans}


LOOP_OVERHEADS = ("data wait", "checkpoint stall")  # they grow with the training loop; the others are per stage


def overheads_of(report: dict) -> dict:
    """What a measured run's overheads say about another run: data wait and checkpoint stall as
    shares of its training loop (they grow with it), the others as wall seconds per stage job."""
    rows = {row["category"]: row["gpu_hours"] for row in report["gpu"]["rows"]}
    loop = rows["training"] + sum(rows[name] for name in LOOP_OVERHEADS)
    stages = max(len(report["stages"]), 1)
    return {
        "loop_shares": {name: rows[name] / loop if loop else 0.0 for name in LOOP_OVERHEADS},
        "seconds_per_stage": {
            name: rows[name] * 3600 / report["gpus"] / stages for name in OVERHEADS if name not in LOOP_OVERHEADS
        },
    }


def modelled(cost: CostConfig, training_hours: dict[str, float], gpus: int, model: str, overheads: dict) -> dict:
    """A run that is not measured: `training_hours` per stage (the wall time of its steps on `gpus`
    GPUs of `model`) with a measured run's `overheads` (`overheads_of`). Priced under every plan."""
    kept = 1.0 - sum(overheads["loop_shares"].values())
    if kept <= 0:
        raise CostError(f"the measured loop overheads {overheads['loop_shares']} leave no training")
    training = sum(training_hours.values()) * gpus
    rows = {"training": training, **{name: training / kept * share for name, share in overheads["loop_shares"].items()}}
    for name, seconds in overheads["seconds_per_stage"].items():
        rows[name] = seconds * len(training_hours) * gpus / 3600
    allocated = sum(rows.values())
    return {
        "gpus": gpus,
        "model": model,
        "wall_hours": allocated / gpus,
        "allocated_gpu_hours": allocated,
        "rows": rows,
        "usd": {plan: allocated * gpu_rate(cost, model, plan) for plan in ("on-demand", "reserved", "burst")},
    }


def record_cost(
    config: PipelineConfig, store: ObjectStore, tracker, run_id: str, mlflow_run: str, attempts: list[Attempt]
) -> dict:
    """The run's report, logged to its MLflow run (``cost/*`` metrics, ``cost.json``) and the
    Pushgateway (``drape_run_cost_dollars``, ``drape_stage_cost_dollars``). A cost that cannot be
    worked out (an unpriced GPU model) or logged is reported and never fails the run."""
    try:
        report = run_report(config, store, run_id, attempts)
    except Exception as error:  # noqa: BLE001 - a finished run is never failed by its accounting
        print(f"drape: the cost of run {run_id} could not be worked out ({type(error).__name__}: {error})")
        return {"error": f"{type(error).__name__}: {error}"}
    try:
        _publish(config, tracker, run_id, mlflow_run, report)
    except Exception as error:  # noqa: BLE001 - the report stands; `drape cost report` recomputes it
        print(f"drape: the cost of run {run_id} was not logged to MLflow ({type(error).__name__}: {error})")
    return report


def _publish(config: PipelineConfig, tracker, run_id: str, mlflow_run: str, report: dict) -> None:
    import tempfile
    from pathlib import Path

    from drape.ops import metrics

    values = {f"cost/{row['category'].replace(' ', '_')}_gpu_hours": row["gpu_hours"] for row in report["gpu"]["rows"]}
    values |= {"cost/allocated_gpu_hours": report["gpu"]["allocated_gpu_hours"], "cost/gpu_usd": report["gpu"]["usd"]}
    values |= {"cost/storage_usd": report["storage"]["usd"], "cost/total_usd": report["total_usd"]}
    tracker.log_metrics(mlflow_run, values)
    with tempfile.TemporaryDirectory(prefix="drape-cost-") as scratch:
        path = Path(scratch) / "cost.json"
        path.write_text(json.dumps(report, indent=2, sort_keys=True))
        tracker.log_artifact(mlflow_run, path)
    for row in report["gpu"]["rows"]:
        metrics.RUN_COST.labels(run=run_id, category=row["category"]).set(row["usd"])
    metrics.RUN_COST.labels(run=run_id, category="storage").set(report["storage"]["usd"])
    for row in report["stages"]:
        metrics.STAGE_COST.labels(run=run_id, stage=row["stage"], promoted=str(row["promoted"]).lower()).set(row["usd"])
    metrics.push_metrics(config, grouping={"run": run_id})
