"""A personalization's report: the gate's values, the adapter, the job's time and memory, its cost.

Cost: the job's wall time on its device (one GPU, or a CPU slot) priced at `shoppers.prices`,
and the bytes held for the shopper (photos, adapter, report) per month and over the consent.
"""

from __future__ import annotations

from datetime import datetime

from drape.config import PipelineConfig
from drape.inference.source import ResolvedModel
from drape.layout import ShopperPaths
from drape.shoppers.ledger import Ledger
from drape.storage.store import tree_bytes

GB = 1e9
DAYS_PER_MONTH = 30.44


def cost(config: PipelineConfig, job: dict, stored_bytes: int, ledger: Ledger) -> dict:
    prices = config.shoppers.prices
    hours = job["seconds"] / 3600
    hourly = prices.gpu_hour if job["device"] == "cuda" else prices.cpu_hour
    months = (datetime.fromisoformat(ledger.expires_at) - datetime.fromisoformat(ledger.consented_at)).days / DAYS_PER_MONTH
    monthly = stored_bytes / GB * prices.storage_gb_month
    return {
        "device_hours": hours,
        "hourly_usd": hourly,
        "compute_usd": hours * hourly,
        "stored_bytes": stored_bytes,
        "storage_usd_per_month": monthly,
        "storage_usd_over_consent": monthly * months,
        "consent_months": months,
    }


def build_report(
    config: PipelineConfig, paths: ShopperPaths, ledger: Ledger, source: ResolvedModel, verdict: dict, job: dict, fitted
) -> dict:
    kept = verdict["passed"]
    adapter_bytes = tree_bytes(paths.adapter) if kept else 0
    stored = tree_bytes(paths.photos) + tree_bytes(paths.holdout) + tree_bytes(paths.adapter)
    return {
        "shopper": ledger.shopper,
        "status": "kept" if kept else "rejected",
        "base": {"model": source.label, "alias": source.alias, "version": source.version},
        "adapter": {
            "bytes": adapter_bytes,
            "parameters": _adapter_parameters(fitted),
            "rank": config.shoppers.rank,
            "layers": len(fitted.spec.targets),
            "final_loss": fitted.loss,
        },
        "gate": verdict,
        "job": job,
        "cost": cost(config, job, stored, ledger),
        "consent": {"consented_at": ledger.consented_at, "expires_at": ledger.expires_at},
    }


def _adapter_parameters(fitted) -> int:
    """Parameters of the adapter: rank × (in + out) per adapted layer (after a merge the model has none left)."""
    rank, model = fitted.spec.config.rank, fitted.model
    return sum(rank * (m.in_features + m.out_features) for n, m in model.named_modules() if n in set(fitted.spec.targets))
