"""Checkpoint preemption through the live dispatcher (`scheduler/policy/checkpoints.py`): a gang job waiting
past `gang_max_wait_s` stops running jobs on a full fleet, and the dispatcher's preemption path
(`Dispatcher._preempt`) stops their processes (local launcher) and requeues them to resume."""

from __future__ import annotations

import json
import os
import time

import pytest

from scheduler.queue.store import JobSpec, JobStore
from tests.integration.test_queue import _config_file

pytestmark = pytest.mark.slow


def _gone(handle: str) -> bool:
    pid = int(handle.split(":")[1])
    return not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()


def test_an_overdue_gang_job_stops_preemptible_jobs_and_they_wait_to_resume(tmp_path):
    """~2 s. Both H100 nodes (4 GPUs each) are full of H100-only services, one of them declared not
    preemptible; a 4-GPU stage job has waited 5 h. It takes the other node: its four services are
    stopped (their processes end) and queued again, preempted for it, with no attempt spent; they
    wait (no GPU is free), and the service that may not be preempted runs on."""
    from scheduler.dispatch.dispatcher import Dispatcher

    config, _ = _config_file(tmp_path, preempt_after_seconds=0, gang_max_wait_seconds=3600)
    store = JobStore(config.queue_url)
    dispatcher = Dispatcher(config, store)
    assert dispatcher.policy.gang_max_wait_s == 3600.0 and dispatcher.policy.preempt_after_s is None
    sleep = ["sh", "-c", "exec sleep 120"]
    spec = {"kind": "inference-benchmark", "mem_gib": 60, "duration_s": 36000, "gpu_models": ["H100"], "command": sleep}
    pinned = store.submit(JobSpec(preemptible=False, **spec))
    services = [store.submit(JobSpec(checkpoint_every_s=900, **spec)) for _ in range(7)]
    jobs = [pinned, *services]
    try:
        dispatcher.cycle()
        node = {job: json.loads(store.get(job)["assigned"])[0].split("/")[0] for job in jobs}
        assert all(store.get(job)["state"] == "running" for job in jobs) and len(set(node.values())) == 2
        handles = {job: store.get(job)["handle"] for job in jobs}
        stage = store.submit(
            JobSpec(kind="stage-training", gpus=4, mem_gib=70, duration_s=600, priority=5, command=sleep),
            now=time.time() - 5 * 3600,
        )
        jobs.append(stage)
        report = dispatcher.cycle()
        free = next(n for n in set(node.values()) if n != node[pinned])
        stopped = sorted(job for job in services if node[job] == free)
        assert stage in report.started and sorted(report.preempted) == stopped, report
        assert json.loads(store.get(stage)["assigned"])[0].startswith(free)
        for job in stopped:
            row = store.get(job)
            assert row["state"] == "queued" and f"preempted for {stage}" in row["message"] and row["attempts"] == 0
            assert json.loads(row["labels"])["preempted"] == "1" and float(json.loads(row["labels"])["requeued_s"]) > 0
            deadline = time.monotonic() + 10
            while not _gone(handles[job]):
                assert time.monotonic() < deadline, f"{job}'s process was not stopped"
                time.sleep(0.05)
        assert store.get(pinned)["state"] == "running" and not _gone(handles[pinned])
        again = dispatcher.cycle()  # the stopped services wait: nothing is free and the stage job is not overdue
        assert not again.started and not again.preempted
        assert all(store.get(job)["state"] == "queued" for job in stopped)
    finally:
        for job in jobs:
            store.cancel(job)
        dispatcher.cycle()
