"""The `prestage-dataset` flow: fill a node's shard cache with the given stages' shards ahead of a run.

Stages are pre-staged in order, each within the cache budget, keeping the control set and the
stages already staged by this flow run (so a budget too small for all of them fails early).
"""

from __future__ import annotations

from prefect import flow

from drape import STAGES
from drape.config import default_config_path, load_config
from tasks import stages as t


@flow(name="prestage-dataset", log_prints=True)
def prestage_dataset(config_path: str = str(default_config_path()), stages: list[str] | None = None) -> list[dict]:
    config = load_config(config_path)
    wanted = list(stages or STAGES)
    unknown = [s for s in wanted if s not in (*STAGES, "control")]
    if unknown:
        raise ValueError(f"unknown stages {unknown}; expected some of {list(STAGES)} or 'control'")
    results = []
    for index, stage in enumerate(wanted):
        result = t.prestage_dataset(config, stage, ["control", *wanted[:index]])
        print(f"prestage-{stage}: {result['shards']} shards, {result['bytes']} bytes ({result['downloaded']} downloaded)")
        results.append(result)
    return results
