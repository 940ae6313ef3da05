"""The `queue-dispatcher` flow: a long-running GPU queue dispatcher as a Prefect deployment.

It serves Prometheus metrics on `metrics_port` and dispatches until `max_minutes` pass (None:
until the flow run is cancelled), so the Prefect UI shows it running and operators stop it there.
"""

from __future__ import annotations

from prefect import flow

from drape.config import default_config_path, load_config
from tasks import queue as q


@flow(name="queue-dispatcher", log_prints=True)
def queue_dispatcher(
    config_path: str = str(default_config_path()), max_minutes: float | None = None, metrics_port: int | None = 9400
) -> dict:
    config = load_config(config_path)
    return q.dispatch(config, max_minutes, metrics_port)
