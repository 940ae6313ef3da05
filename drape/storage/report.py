"""What storage holds and costs: live bytes by kind, archived bytes by kind, outcome and class,
a modelled monthly cost, and what expires next."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from drape.config import PipelineConfig
from drape.layout import artifact_kind
from drape.storage.retention import read_archive_manifest
from drape.storage.store import ObjectStore

GB = 1e9


def live_bytes_by_kind(live_root: str | Path) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    root = Path(live_root)
    for path in root.rglob("*") if root.exists() else []:
        if path.is_file():
            totals[artifact_kind(path.relative_to(root))] += path.stat().st_size
    return dict(totals)


def storage_report(config: PipelineConfig, store: ObjectStore, live_root: str | Path, *, now: datetime | None = None) -> dict:
    """Live and archived bytes, modelled monthly cost in USD, and the next expiries."""
    now = now or datetime.now(UTC)
    prices = config.storage.prices_per_gb_month
    records = [r for r in read_archive_manifest(store) if not r["expires_at"] or datetime.fromisoformat(r["expires_at"]) > now]
    archived: dict[tuple[str, str, str], int] = defaultdict(int)
    for record in records:
        archived[(record["kind"], record["outcome"], record["storage_class"])] += record["bytes"]
    live = live_bytes_by_kind(live_root)
    live_cost = sum(live.values()) / GB * prices.get("live", 0.0)
    archive_cost = sum(size / GB * prices.get(cls, prices.get("STANDARD", 0.0)) for (_, _, cls), size in archived.items())
    upcoming = sorted((r for r in records if r["expires_at"]), key=lambda r: r["expires_at"])[:5]
    return {
        "live_bytes": live,
        "archived_bytes": {"/".join(k): v for k, v in sorted(archived.items())},
        "monthly_cost_usd": {"live": live_cost, "archive": archive_cost, "total": live_cost + archive_cost},
        "expires_next": [{"key": r["key"], "expires_at": r["expires_at"], "bytes": r["bytes"]} for r in upcoming],
    }
