"""Per-shopper personalization through the queue, and the queue's part in forgetting a shopper.

A personalization is a job of kind ``personalization`` with its own memory profile (the frozen
base, the adapter's states and `shoppers.batch_size` activations: `scheduler.jobs.profiles`), one
GPU. Its id is chosen before it is submitted, so the shopper's ledger names it before the job
exists and a forget always finds its record.

`QueuePlace` erases what the queue holds of a shopper: the inputs of their jobs' records
(command, environment, labels: the paths name the shopper) are overwritten, the resources and
times kept for accounting, and the jobs' logs removed; its scan reads every record and log.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

from drape import JobKind
from drape.mounts import job_paths, model_paths
from drape.shoppers import subject_of
from drape.shoppers.forget import Subject
from drape.shoppers.ledger import require_ledger, write_ledger
from drape.shoppers.personalize import shopper_paths
from scheduler.dispatch.dispatcher import queue_dir, submit_and_wait
from scheduler.jobs.profiles import profile
from scheduler.queue.store import JobSpec, JobStore

ERASED = "erased on the shopper's request"


def personalization_job_spec(config, *, shopper: str, job_file: Path) -> JobSpec:
    sized = profile(config, JobStore(config.queue_url), JobKind.PERSONALIZATION, None)
    return JobSpec(
        kind=JobKind.PERSONALIZATION,
        command=[sys.executable, "-m", "drape.shoppers.personalize", str(job_file)],
        gpus=1,
        mem_gib=sized.mem_gib,
        duration_s=sized.duration_s,
        shape=sized.shape,
        priority=2,  # below stage training and gates: a shopper waits minutes, a stage job holds a node
        labels={
            "subject": subject_of(shopper),
            "mounts": json.dumps(job_paths(config)),
            "models": json.dumps(model_paths(config)),
        },
        id=f"personalization-{uuid.uuid4().hex[:10]}",
    )


def run_personalization(config, *, shopper: str, base: str | None, on_line=None) -> dict:
    """The personalization as a queue job, waited for; returns the report it wrote."""
    paths = shopper_paths(config, shopper)
    ledger = require_ledger(paths)
    paths.job.write_text(json.dumps({"config": config.model_dump(mode="json", by_alias=True), "shopper": shopper, "base": base}))
    spec = personalization_job_spec(config, shopper=shopper, job_file=paths.job)
    assert spec.id is not None
    ledger.remember("jobs", spec.id)
    write_ledger(paths, ledger)
    submit_and_wait(config, spec, on_line=on_line, timeout_s=config.shoppers.timeout_seconds)
    return json.loads(paths.report.read_text())


class QueuePlace:
    name = "queue"

    def __init__(self, config):
        self.store = JobStore(config.queue_url)
        self.logs = queue_dir(config) / "logs"

    def _theirs(self, subject: Subject) -> list[dict]:
        label = subject_of(subject.shopper)
        return [
            job
            for job in self.store.jobs()
            if job["id"] in subject.jobs
            or json.loads(job["labels"] or "{}").get("subject") == label
            or subject.shopper in job["command"]
        ]

    def erase(self, subject: Subject) -> dict[str, int]:
        jobs, logs = self._theirs(subject), 0
        for job in jobs:
            if job["state"] in ("queued", "running"):
                self.store.cancel(job["id"])  # its inputs are about to go
            self.store.scrub(job["id"], ERASED)
            for path in self.logs.glob(f"{job['id']}.*"):
                path.unlink()
                logs += 1
        return {"job_records": len(jobs), "job_logs": logs}

    def scan(self, subject: Subject) -> list[str]:
        needles = [subject.shopper, *subject.photo_digests.sha256]
        found = []
        for job in self.store.jobs():
            text = " ".join(str(job[column]) for column in ("command", "env", "labels", "message"))
            if any(needle in text for needle in needles):
                found.append(f"job {job['id']}")
        for path in sorted(self.logs.glob("*")) if self.logs.is_dir() else []:
            if path.is_file() and subject.shopper.encode() in path.read_bytes():
                found.append(f"log {path.name}")
        return found
