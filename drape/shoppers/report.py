"""A personalization's report: the gate's values, the adapter, the job's time and memory, its cost.

Cost: the job's wall time on its device (one GPU, or a CPU slot) priced by the price table
(`cost.gpu_prices` at `cost.plan`, drape/cost/), and the bytes held for the shopper (photos,
adapter, report) per month and over the consent, at `storage.prices_per_gb_month` STANDARD.
"""

from __future__ import annotations

from datetime import datetime

from drape.config import PipelineConfig
from drape.cost import CostError, gpu_rate
from drape.inference.source import ResolvedModel
from drape.layout import ShopperPaths
from drape.shoppers.ledger import Ledger
from drape.storage.store import tree_bytes

GB = 1e9
DAYS_PER_MONTH = 30.44


def cost(config: PipelineConfig, job: dict, stored_bytes: int, ledger: Ledger) -> dict:
    """The job's compute and the shopper's storage in USD; an unpriced device is priced at 0 and named."""
    hours, unpriced = job["seconds"] / 3600, {}
    try:
        hourly = gpu_rate(config.cost, job["device"], config.cost.plan)
    except CostError as error:
        hourly, unpriced = 0.0, {"price_note": str(error)}
    months = (datetime.fromisoformat(ledger.expires_at) - datetime.fromisoformat(ledger.consented_at)).days / DAYS_PER_MONTH
    monthly = stored_bytes / GB * config.storage.prices_per_gb_month.get("STANDARD", 0.0)
    return {
        **unpriced,
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
