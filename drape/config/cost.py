"""Config of what things cost (`drape cost`, drape/cost/): the price table.

GPU-hours are priced per GPU model and plan; storage per GB-month by storage class
(`storage.prices_per_gb_month`, which the storage report uses too); object-store requests per
thousand; egress per GB. The H100 defaults are the figures teams decide by: $2.49 per GPU-hour on
demand ($19.92/h for an 8×H100 node), $2.69 in bursts. The reserved rate is an assumption (a
one-year commitment about a quarter under on demand): put your contract's figures here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from drape.config.base import StrictModel

PLANS = ("on-demand", "reserved", "burst")
Plan = Literal["on-demand", "reserved", "burst"]


class GpuPrice(StrictModel):
    """USD per GPU-hour of one GPU model under each plan."""

    on_demand: float = Field(ge=0, description="USD per GPU-hour bought on demand")
    reserved: float = Field(ge=0, description="USD per GPU-hour of reserved (committed) capacity")
    burst: float = Field(ge=0, description="USD per GPU-hour in bursts beyond the reservation")

    def rate(self, plan: str) -> float:
        return {"on-demand": self.on_demand, "reserved": self.reserved, "burst": self.burst}[plan]


class CostConfig(StrictModel):
    """Prices (USD) and which plan a run and the queue's fleet are bought on."""

    plan: Plan = Field(default="on-demand", description="the plan a run's GPU-hours are priced at (`--plan` overrides)")
    fleet_plan: Plan = Field(default="reserved", description="how the queue's fleet is bought: its idle hours are priced at this")
    gpu_prices: dict[str, GpuPrice] = Field(
        default_factory=lambda: {"H100": GpuPrice(on_demand=2.49, reserved=1.89, burst=2.69)},
        description=(
            "per GPU model, matched case-insensitively as a part of the model's name that cuts no number (the "
            "longest key wins): 'H100' prices 'NVIDIA H100 80GB HBM3', 'A10' not an A100; the local CPU slot's model is 'cpu'"
        ),
    )
    put_per_1000: float = Field(default=0.005, ge=0, description="object-store PUT, COPY, POST, LIST requests, per 1,000")
    get_per_1000: float = Field(default=0.0004, ge=0, description="object-store GET and HEAD requests, per 1,000")
    egress_per_gb: float = Field(
        default=0.0,
        ge=0,
        description="bytes read out of the object store; 0 where the provider charges none (S3 to EC2 in-region)",
    )
    horizon_months: float = Field(
        default=12.0, gt=0, description="archived artifacts kept forever (gate reports) are priced over this many months"
    )
