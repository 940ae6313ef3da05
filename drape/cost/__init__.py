"""What a run costs: GPU-hours, the hours spent not training, storage, requests and egress, in money.

    timeline.py  what a run records of its own time (opened, closed, each step of each stage, the
                 training loop), under ``runs/<run>/cost/`` in the object store
    account.py   the run's GPU-hours, split into training and each kind of overhead, per stage
    storage.py   the run's storage: archived and live GB-months by class, requests, egress
    report.py    the report (`drape cost report`), plans side by side (`drape cost compare`),
                 the summary's and MLflow's cost section, the modelled run (`drape cost estimate`)
    scaling.py   scaling efficiency measured at 1, 2, ... ranks, recorded per job shape
    fleet.py     reserved GPU-hours the queue left idle over a window, priced

The queue's side (which GPUs a run's jobs held, and when) is read by `scheduler/dispatch/accounting.py` and
handed in as plain `Attempt`s: drape/ never imports the queue.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from drape.config.cost import CostConfig

HOURS_PER_MONTH = 730.5  # 365.25 × 24 / 12
GB = 1e9


class CostError(ValueError):
    """A cost that cannot be worked out: an unpriced GPU model, a run with no record; names what is missing."""


def gpu_rate(cost: CostConfig, model: str, plan: str) -> float:
    """USD per GPU-hour of `model` under `plan`: the longest `cost.gpu_prices` key that is a part of
    its name, in any case, with no digit either side (the rule a job's GPU models follow,
    `scheduler.policy.state.names_model`): "A10" prices an A10G, not an A100."""
    matches = [key for key in cost.gpu_prices if re.search(rf"(?<![0-9]){re.escape(key)}(?![0-9])", model, re.IGNORECASE)]
    if not matches:
        raise CostError(
            f"GPU model {model!r} has no price: add it to cost.gpu_prices, keyed by a part of its name "
            f"(priced now: {sorted(cost.gpu_prices)}), e.g. {{on_demand: 2.49, reserved: 1.89, burst: 2.69}}"
        )
    return cost.gpu_prices[max(matches, key=len)].rate(plan)
