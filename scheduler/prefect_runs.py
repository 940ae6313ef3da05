"""The Prefect engine: a queue job as a flow run of a deployment on a work pool (`run_deployment`)."""

from __future__ import annotations

import json
from pathlib import Path
from uuid import UUID

from scheduler.engine import Outcome, device_indices
from scheduler.policy import GpuState


class PrefectLauncher:
    """Runs the job as a flow run of deployment ``labels['deployment']`` with ``labels['parameters']``;
    `handle` is ``flow-run:<id>``."""

    def launch(self, job: dict, gpus: list[GpuState]) -> str:
        from prefect.deployments import run_deployment

        labels = json.loads(job["labels"] or "{}")
        if "deployment" not in labels:
            raise ValueError(f"job {job['id']}: the prefect launcher needs labels.deployment ('<flow>/<deployment>')")
        run = run_deployment(
            labels["deployment"],
            parameters=json.loads(labels.get("parameters", "{}")),
            timeout=0,
            job_variables={"env": {"CUDA_VISIBLE_DEVICES": device_indices(gpus), "DRAPE_JOB_ID": job["id"]}},
        )
        return f"flow-run:{run.id}"  # type: ignore[union-attr]  # run_deployment is sync outside an event loop

    def sees(self, handle: str | None) -> bool:
        return bool(handle and handle.startswith("flow-run:"))

    def poll(self, job_id: str, handle: str) -> Outcome | None:
        from prefect import get_client

        with get_client(sync_client=True) as client:
            state = client.read_flow_run(UUID(handle.partition(":")[2])).state
        if state is None or not state.is_final():
            return None
        return Outcome(0 if state.is_completed() else 1, f"flow run {state.name}")

    def cancel(self, job_id: str, handle: str) -> None:
        from prefect import get_client
        from prefect.states import Cancelling

        with get_client(sync_client=True) as client:
            client.set_flow_run_state(UUID(handle.partition(":")[2]), Cancelling())


def build(config, log_dir: Path) -> PrefectLauncher:
    return PrefectLauncher()
