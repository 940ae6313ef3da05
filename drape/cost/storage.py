"""A run's storage in money: what it archived (GB-months by storage class, over each artifact's
lifetime from the retention records), what it kept live while it ran, what it registered as
baselines, the object-store requests it made and the bytes it read out (egress)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from drape.config import PipelineConfig
from drape.cost import GB, HOURS_PER_MONTH
from drape.cost.account import GpuAccount
from drape.layout import archive_manifest_prefix
from drape.storage.retention import read_archive_manifest
from drape.storage.store import ObjectStore

DAYS_PER_MONTH = 30.4375


def _months(record: dict, horizon: float) -> float:
    if not record.get("expires_at"):
        return horizon
    lived = datetime.fromisoformat(record["expires_at"]) - datetime.fromisoformat(record["archived_at"])
    return lived.total_seconds() / 86400 / DAYS_PER_MONTH


def storage_cost(config: PipelineConfig, store: ObjectStore, run_id: str, events: list[dict], account: GpuAccount) -> dict:
    """Storage rows of the run's cost (USD), in total and per stage."""
    prices, cost = config.storage.prices_per_gb_month, config.cost
    records = read_archive_manifest(store, archive_manifest_prefix(run_id), include_deleted=True)
    classes: dict[str, dict] = defaultdict(lambda: {"bytes": 0, "gb_months": 0.0, "usd": 0.0})
    per_stage: dict[str, float] = defaultdict(float)
    for record in records:
        row = classes[record["storage_class"]]
        gb_months = record["bytes"] / GB * _months(record, cost.horizon_months)
        usd = gb_months * prices.get(record["storage_class"], prices.get("STANDARD", 0.0))
        row["bytes"] += record["bytes"]
        row["gb_months"] += gb_months
        row["usd"] += usd
        per_stage[record["stage"]] += usd
    live = _live(events, account, prices.get("live", 0.0), per_stage)
    registry = _registry(events, cost.horizon_months, prices.get("STANDARD", 0.0), per_stage)
    requests = _requests(config, records, events, per_stage)
    egress = _egress(config, events, per_stage)
    total = sum(c["usd"] for c in classes.values()) + live["usd"] + registry["usd"] + requests["usd"] + egress["usd"]
    return {
        "archived": {name: classes[name] for name in sorted(classes)},
        "live": live,
        "registry": registry,
        "requests": requests,
        "egress": egress,
        "usd": total,
        "per_stage_usd": dict(per_stage),
        "run_level_usd": total - sum(per_stage.values()),  # the run's own records (opened, closed)
    }


def _live(events: list[dict], account: GpuAccount, price: float, per_stage: dict[str, float]) -> dict:
    """Live storage while the run ran: each stage's window at the footprint its archive step found."""
    found = {e["stage"]: e.get("live_bytes_before", 0) for e in events if e.get("step") == "archive"}
    gb_months = 0.0
    for stage, (start, end) in account.windows.items():
        months = found.get(stage, 0) / GB * (end - start) / 3600 / HOURS_PER_MONTH
        gb_months += months
        per_stage[stage] += months * price
    return {"gb_months": gb_months, "usd": gb_months * price}


def _registry(events: list[dict], horizon: float, price: float, per_stage: dict[str, float]) -> dict:
    """The promoted baselines' copies in the registry (MLflow's artifact store), over the horizon."""
    snapshots = {e["stage"]: e.get("bytes", 0) for e in events if e.get("step") == "snapshot"}
    for stage, size in snapshots.items():
        per_stage[stage] += size / GB * horizon * price
    size = sum(snapshots.values())
    return {"bytes": size, "gb_months": size / GB * horizon, "usd": size / GB * horizon * price}


def _requests(config: PipelineConfig, records: list[dict], events: list[dict], per_stage: dict[str, float]) -> dict:
    """PUTs: archived objects, one archive manifest per stage, the cost records, the registry's files;
    GETs: each archived object read back to verify it, each shard pre-staging downloaded."""
    cost, counts = config.cost, defaultdict[str, list[int]](lambda: [0, 0])
    for record in records:
        counts[record["stage"]][0] += 1
        counts[record["stage"]][1] += 1
    for stage in {r["stage"] for r in records}:
        counts[stage][0] += 1
    for event in events:
        counts[event.get("stage") or ""][0] += 1 + (event.get("files", 0) if event.get("step") == "snapshot" else 0)
        counts[event.get("stage") or ""][1] += event.get("downloaded", 0) if event.get("step") == "prestage" else 0
    for stage, (puts, gets) in counts.items():
        if stage:
            per_stage[stage] += puts / 1000 * cost.put_per_1000 + gets / 1000 * cost.get_per_1000
    puts, gets = sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())
    return {"put": puts, "get": gets, "usd": puts / 1000 * cost.put_per_1000 + gets / 1000 * cost.get_per_1000}


def _egress(config: PipelineConfig, events: list[dict], per_stage: dict[str, float]) -> dict:
    """Bytes pre-staging read out of the object store, at `cost.egress_per_gb`."""
    downloaded = 0
    for event in events:
        if event.get("step") == "prestage":
            downloaded += event.get("downloaded_bytes", 0)
            per_stage[event["stage"]] += event.get("downloaded_bytes", 0) / GB * config.cost.egress_per_gb
    return {"bytes": downloaded, "usd": downloaded / GB * config.cost.egress_per_gb}
