"""What storage holds and costs: live bytes by kind, archived bytes by kind, outcome and class,
a modelled monthly cost, what expires next, and bringing an archived stage back to live storage."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from drape.config import PipelineConfig
from drape.retention import read_archive_manifest
from drape.storage import ObjectStore

GB = 1e9


def live_kind(relative: Path) -> str:
    """The artifact kind of a file under live storage, from where it lives."""
    parts = relative.parts
    if parts[0] == "shards":
        return "synthetic_imagery"
    if "checkpoint" in parts or "checkpoints" in parts:
        return "checkpoint"
    if parts[-1] == "report.json":
        return "gate_report"
    if parts[-1] == "latents.safetensors":
        return "latent_snapshot"
    return "validation_output"


def live_bytes_by_kind(live_root: str | Path) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    root = Path(live_root)
    for path in root.rglob("*") if root.exists() else []:
        if path.is_file():
            totals[live_kind(path.relative_to(root))] += path.stat().st_size
    return dict(totals)


def storage_report(config: PipelineConfig, store: ObjectStore, live_root: str | Path, *, now: datetime | None = None) -> dict:
    """Live and archived bytes, modelled monthly cost in USD, and the next expiries."""
    now = now or datetime.now(timezone.utc)
    prices = config.storage.prices_per_gb_month
    records = [r for r in read_archive_manifest(store) if not r["expires_at"] or datetime.fromisoformat(r["expires_at"]) > now]
    archived: dict[tuple[str, str, str], int] = defaultdict(int)
    for record in records:
        archived[(record["kind"], record["outcome"], record["storage_class"])] += record["bytes"]
    live = live_bytes_by_kind(live_root)
    live_cost = sum(live.values()) / GB * prices.get("live", 0.0)
    archive_cost = sum(size / GB * prices.get(cls, prices.get("STANDARD", 0.0)) for (_, _, cls), size in archived.items())
    upcoming = sorted((r for r in records if r["expires_at"]), key=lambda r: r["expires_at"])[:5]
    return {"live_bytes": live, "archived_bytes": {"/".join(k): v for k, v in sorted(archived.items())},
            "monthly_cost_usd": {"live": live_cost, "archive": archive_cost, "total": live_cost + archive_cost},
            "expires_next": [{"key": r["key"], "expires_at": r["expires_at"], "bytes": r["bytes"]} for r in upcoming]}


def restore_stage(store: ObjectStore, run_id: str, stage: str, destination: str | Path) -> list[Path]:
    """Bring a stage's archived files back under `destination`, each verified against its record."""
    records = [r for r in read_archive_manifest(store) if r["run_id"] == run_id and r["stage"] == stage]
    if not records:
        raise FileNotFoundError(f"no archived artifacts for run {run_id!r} stage {stage!r} in {store!r}")
    prefix = f"runs/{run_id}/{stage}/"
    return [store.get_file(r["key"], Path(destination) / r["key"].removeprefix(prefix), sha256=r["sha256"]) for r in records]
