"""The `retention-sweep` flow: enforce artifact lifetimes where lifecycle rules cannot and retag
superseded baselines. Schedulable (e.g. daily) from a deployment."""

from __future__ import annotations

from prefect import flow

from drape.config import default_config_path, load_config
from tasks import stages as t


@flow(name="retention-sweep", log_prints=True)
def retention_sweep(config_path: str = str(default_config_path()), dry_run: bool = False) -> dict:
    config = load_config(config_path)
    return t.sweep(config, dry_run)
