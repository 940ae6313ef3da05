"""Prefect task around the GPU queue dispatcher (scheduler/): one core call."""

from __future__ import annotations

import time

from prefect import task
from prefect.cache_policies import NONE

from drape.config import PipelineConfig


@task(name="dispatch", cache_policy=NONE, log_prints=True)
def dispatch(config: PipelineConfig, max_minutes: float | None, metrics_port: int | None) -> dict:
    """Run a dispatcher until `max_minutes` pass (forever when None); returns what it did."""
    from scheduler.dispatch.dispatcher import Dispatcher

    if metrics_port:
        from drape.ops.metrics import serve_metrics

        serve_metrics(metrics_port)
    dispatcher = Dispatcher(config)
    deadline = None if max_minutes is None else time.monotonic() + 60 * max_minutes
    totals = {"cycles": 0, "started": 0, "finished": 0, "requeued": 0}

    def count(report) -> None:
        totals["cycles"] += 1
        for key in ("started", "finished", "requeued"):
            totals[key] += len(getattr(report, key))
        if report.started or report.finished:
            print(f"dispatcher {dispatcher.id}: started {len(report.started)}, finished {len(report.finished)}")

    dispatcher.run(stop=lambda: deadline is not None and time.monotonic() > deadline, on_cycle=count)
    return totals
