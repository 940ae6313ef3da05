"""What idle capacity costs: over a window, each GPU of the queue's fleet is allocated (the union
of its claims, from the allocation log) or idle; idle hours are priced at the fleet's plan
(`cost.fleet_plan`, reserved by default), per GPU model."""

from __future__ import annotations

from collections import defaultdict

from drape.config.cost import CostConfig
from drape.cost import gpu_rate
from drape.cost.account import Interval, clip, measure


def held_intervals(events: list[dict], now: float) -> dict[str, list[Interval]]:
    """GPU uuid → the intervals some job held it, from allocation-log rows (`job_id`, `gpu_uuid`,
    `event` claim | release, `at_s`); a claim with no release yet is held until `now`."""
    open_claims: dict[tuple[str, str], float] = {}
    held: dict[str, list[Interval]] = defaultdict(list)
    for row in sorted(events, key=lambda r: (r["at_s"], r["event"] != "release")):
        key = (row["job_id"], row["gpu_uuid"])
        if row["event"] == "claim":
            open_claims[key] = row["at_s"]
        elif key in open_claims:
            held[row["gpu_uuid"]].append((open_claims.pop(key), row["at_s"]))
    for (_, gpu), start in open_claims.items():
        held[gpu].append((start, now))
    return held


def idle_cost(cost: CostConfig, inventory: list[tuple[str, str]], events: list[dict], start: float, end: float) -> dict:
    """`inventory`: (uuid, model) of every GPU; returns per model GPUs, allocated and idle GPU-hours
    and the idle hours' price at `cost.fleet_plan`, and the totals."""
    held = held_intervals(events, end)
    models: dict[str, dict] = {}
    for uuid, model in inventory:
        row = models.setdefault(model, {"model": model, "gpus": 0, "allocated_gpu_hours": 0.0, "idle_gpu_hours": 0.0})
        busy = measure(clip(held.get(uuid, []), start, end)) / 3600
        row["gpus"] += 1
        row["allocated_gpu_hours"] += busy
        row["idle_gpu_hours"] += (end - start) / 3600 - busy
    for row in models.values():
        row["rate"] = gpu_rate(cost, row["model"], cost.fleet_plan)
        row["idle_usd"] = row["idle_gpu_hours"] * row["rate"]
        total = row["allocated_gpu_hours"] + row["idle_gpu_hours"]
        row["idle_share"] = row["idle_gpu_hours"] / total if total else 0.0
    rows = sorted(models.values(), key=lambda r: r["model"])
    return {
        "window_hours": (end - start) / 3600,
        "plan": cost.fleet_plan,
        "models": rows,
        "idle_gpu_hours": sum(r["idle_gpu_hours"] for r in rows),
        "idle_usd": sum(r["idle_usd"] for r in rows),
    }
