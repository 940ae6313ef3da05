"""Faults a running Slurm job meets, on a real slurmctld and two slurmd (tests/integration/slurm_cluster.py).

Both slurmd run on this host with no mount namespace of their own, so drape's `paths.root` is one
disk for both nodes: the shared-disk variant (test_slurm.py has the node-local one). The object store
is a moto S3 server over HTTP; the queue (SQLite) and its dispatcher are drape's. One cluster serves
the module. Each test states what main did:

1. USR1 before the trainer saved anything new: main requeued the job whatever the trainer had done
   and printed that it "resumes from the checkpoint just published"; a short time limit made a loop.
   Now: no requeue, and the queue's reason says why, plainly.
2. A 2-node job (one rank per node) on the shared `paths.root`, resuming from the store: main had
   both nodes restore into, and free, the same stage folder. Now the nodes probe the disk and one does it.
3. A hung job step with slurmd alive (the trainer's step sleeps): main kept the job RUNNING until a
   person cancelled it. Now the watchdog cancels it and the queue's retry resumes from its checkpoint.
4. A trainer that fails: main recorded "Slurm job N FAILED (NonZeroExitCode), exit code 143 (killed by
   SIGTERM)"; now the reason is the trainer's own error, the root cause among the ranks.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml

from drape.storage.handoff import newest_published, result_key
from drape.storage.progress import read_progress
from drape.storage.store import open_store
from drape.training.jobs.stage_job import StageJob
from scheduler.dispatch.dispatcher import Dispatcher, wait_for
from scheduler.jobs.training import train_job_spec
from scheduler.queue.store import JobStore, QueueError
from tests.conftest import quiet_ports, tiny_config, wait_until
from tests.integration.slurm_cluster import NODES, SlurmCluster, slurm_installed
from tests.integration.test_watchdog import GRACE_SECONDS, HANGING_TRAINER, STALL_SECONDS

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS, EVERY = 12, 4
JOB_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def shared_cluster(moto_server):
    """(SlurmCluster, bucket, endpoint): Slurm up, both slurmd seeing this host's disk."""
    import boto3

    if why := slurm_installed():
        pytest.fail(why)
    bucket = f"drape-faults-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(Bucket=bucket)
    short = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))  # slurmstepd's socket paths stay under 108 bytes
    slurm = SlurmCluster(short)
    try:
        slurm.start()
        yield slurm, bucket, moto_server
    finally:
        print(slurm.logs(tail=20000))
        if slurm.processes:
            slurm.run("scancel", "--full", "--user=root", check=False)
        slurm.close()
        shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def cluster(shared_cluster, tmp_path, monkeypatch):
    slurm, bucket, endpoint = shared_cluster
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the jobs import this checkout (job_environment passes PYTHON*)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    yield slurm, bucket, endpoint
    slurm.run("scancel", "--full", "--user=root", check=False)  # nothing of this test runs into the next


def _config(root: Path, bucket: str, endpoint: str, *, gpus: int, per_node: int, **queue):
    group = {"model": "cpu", "memory_gib": 16, "nodes": len(NODES), "gpus_per_node": per_node}
    (root / "fleet.yaml").write_text(yaml.safe_dump({"groups": [{**group, "node_prefix": NODES[0].rsplit("-", 1)[0]}]}))
    return tiny_config(
        root / "drape",
        storage={"object_store_url": f"s3://{bucket}/{root.name}", "endpoint_url": endpoint},
        data={"shard_max_samples": 12},
        train={
            "gpus": gpus,
            "data_partitions": 4,
            "checkpoint_every": EVERY,
            "stages": {"identity": {"steps": STEPS, "trainable": ["*"]}},
        },
        queue={
            "enabled": True,
            "launcher": "slurm",
            "fleet": "static",
            "inventory": str(root / "fleet.yaml"),
            "max_jobs_per_gpu": 1,
            "poll_seconds": 0.3,
            # a test that cycles its own Dispatcher, then waits with `wait_for` (another dispatcher), has
            # the job adopted once the first one's lease expires: 4 s, not the default 60 s of idle wait
            "lease_seconds": 4,
            "max_attempts": 1,
            "slurm": {
                "accounting": "jobcomp",
                "rendezvous_port": quiet_ports(16),
                "cpus_per_gpu": 1,
                "time_limit_minutes": 30,
                "signal_seconds": 120,
                "rendezvous_timeout_seconds": 120,
            },
            **queue,
        },
    )


def _submit(config, run_id: str, **job) -> str:
    command = StageJob(config, "identity", "unused", run_id=run_id, handoff=True, **job).publish(open_store(config))
    return JobStore(config.queue_url).submit(
        train_job_spec(config, stage="identity", mode="full", run_id=run_id, command=command)
    )


def _log(config, job_id: str) -> str:
    return (Path(config.paths.root) / "queue" / "logs" / f"{job_id}.log").read_text(errors="replace")


def _slurm_runs(slurm: SlurmCluster, job_id: str) -> list[list[str]]:
    out = slurm.run("sacct", "-c", "-X", "-P", "-n", "-o", "JobID,JobName,State,Start,End", check=False)
    return [line.split("|") for line in out.splitlines() if f"|drape-{job_id}-a" in line]


def test_usr1_before_any_new_checkpoint_is_not_requeued_and_the_queue_says_why(cluster, tmp_path):
    slurm, bucket, endpoint = cluster
    config = _config(tmp_path, bucket, endpoint, gpus=1, per_node=2)
    store = JobStore(config.queue_url)
    job_id = _submit(config, "early")
    dispatcher = Dispatcher(config, store)

    def step_started() -> str | None:
        dispatcher.cycle()
        handle = store.get(job_id)["handle"] or ""
        slurm_id = handle.split(":")[1] if handle.startswith("slurm:") else ""
        steps = slurm.run("squeue", "-h", "-s", "-j", slurm_id, "-o", "%i", check=False).split() if slurm_id else []
        return slurm_id if f"{slurm_id}.0" in steps else None

    slurm_id = wait_until(step_started, 60, "the job's step started")
    slurm.run("scancel", "--batch", "--signal=USR1", slurm_id)  # what --signal=B:USR1@N delivers, early
    with pytest.raises(QueueError) as failed:
        wait_for(config, store, job_id, timeout_s=JOB_TIMEOUT)
    row = store.get(job_id)
    first = row["message"].splitlines()[0]
    print(f"before (main): requeued, 'resumes from the checkpoint just published'; after: {first}")
    assert row["state"] == "failed" and "failed" in str(failed.value)
    assert first.startswith("drape: error: USR1 came ") and "before the trainer published a checkpoint newer" in first, first
    assert f"Slurm job {slurm_id} FAILED" in first, first
    log = _log(config, job_id)
    assert "requeueing" not in log and "resumes from" not in log, log[-3000:]
    assert "Restarts=0" in slurm.run("scontrol", "show", "job", "-o", slurm_id)
    assert [r[2] for r in _slurm_runs(slurm, job_id)] == ["FAILED"]  # one run: never requeued
    assert newest_published(open_store(config), "early", "identity") is None  # nothing was saved: nothing claimed


def test_a_two_node_job_on_a_shared_root_has_one_node_do_the_stage_folder_work(cluster, tmp_path):
    slurm, bucket, endpoint = cluster
    config = _config(tmp_path, bucket, endpoint, gpus=2, per_node=1)  # one rank on each of the two nodes
    store = JobStore(config.queue_url)
    # the stage trained once already (here, in one process): both nodes now restore its checkpoint from the store
    StageJob(config, "identity", "unused", run_id="shared", handoff=True).run()
    job_id = _submit(config, "shared")
    row = wait_for(config, store, job_id, timeout_s=JOB_TIMEOUT)
    log = _log(config, job_id)
    assert row["state"] == "succeeded", (row, log[-3000:])
    assert sorted({uuid.split("/")[0] for uuid in json.loads(row["assigned"])}) == sorted(NODES)
    stage_runs = Path(config.paths.root).resolve() / "live" / "runs" / "shared"
    assert f"drape: {stage_runs} is one disk for the nodes of ranks [[0, 1]]" in log, log[-3000:]
    assert "FileNotFoundError" not in log and log.count("resuming from step-0000012") == 1, log[-3000:]  # one node restored
    result = json.loads(open_store(config).read_bytes(result_key("shared", "identity")))
    assert result["world_size"] == 2 and result["steps"] == STEPS and result["resumed_from_step"] == STEPS, result
    assert not any(p.is_file() for p in (stage_runs / "identity").rglob("*")) if (stage_runs / "identity").exists() else True
    assert not list(stage_runs.glob(".disk-probe-*"))  # the probe's markers are gone


def test_hung_job_steps_with_slurmd_alive_are_cancelled_and_retried_from_the_checkpoint(cluster, tmp_path):
    """The trainer's step hangs after step 6 (it sleeps: the job step alive, slurmd alive, Slurm says RUNNING)."""
    slurm, bucket, endpoint = cluster
    config = _config(
        tmp_path,
        bucket,
        endpoint,
        gpus=1,
        per_node=2,
        max_attempts=2,
        stall_timeout_seconds=STALL_SECONDS,
        stall_grace_seconds=GRACE_SECONDS,
    )
    store, objects = JobStore(config.queue_url), open_store(config)
    script, marker = tmp_path / "hanging_trainer.py", tmp_path / "hung.pid"
    script.write_text(textwrap.dedent(HANGING_TRAINER))
    command = StageJob(config, "identity", "unused", run_id="hung", handoff=True).publish(objects)
    command = [command[0], str(script), str(marker), "6", *command[3:]]  # python -m drape.train … as the hanging trainer
    job_id = store.submit(train_job_spec(config, stage="identity", mode="full", run_id="hung", command=command))
    dispatcher = Dispatcher(config, store)

    def hung() -> str | None:
        dispatcher.cycle()
        handle = store.get(job_id)["handle"] or ""
        return handle if marker.is_file() and handle.startswith("slurm:") else None

    first_handle = wait_until(hung, JOB_TIMEOUT, "the job's trainer hung")
    hung_at = time.monotonic()
    assert "JobState=RUNNING" in slurm.run("scontrol", "show", "job", "-o", first_handle.split(":")[1])
    row = wait_for(config, store, job_id, timeout_s=JOB_TIMEOUT)
    print(f"the hung job's retry finished {time.monotonic() - hung_at:.1f} s after its trainer hung")
    assert row["state"] == "succeeded" and row["attempts"] == 2 and row["handle"] != first_handle, row
    assert not Path(f"/proc/{int(marker.read_text())}").exists(), "the hung trainer was left behind"
    runs = _slurm_runs(slurm, job_id)
    assert [r[2] for r in runs] == ["CANCELLED", "COMPLETED"], runs  # Slurm's account: cancelled, then the retry
    result = json.loads(objects.read_bytes(result_key("hung", "identity")))
    assert result["resumed_from_step"] == EVERY and result["steps"] == STEPS, result  # the hung run's checkpoint
    assert read_progress(objects, "hung", "identity").step == STEPS


def test_a_failed_job_s_reason_is_the_trainer_s_own_error(cluster, tmp_path):
    slurm, bucket, endpoint = cluster
    config = _config(tmp_path, bucket, endpoint, gpus=2, per_node=1)
    store = JobStore(config.queue_url)
    job_id = _submit(config, "broken", init_key="handoff/baselines/identity/v404")  # starting weights that are not there
    with pytest.raises(QueueError):
        wait_for(config, store, job_id, timeout_s=JOB_TIMEOUT)
    first = store.get(job_id)["message"].splitlines()[0]
    print(f"before (main): Slurm job N FAILED (NonZeroExitCode), exit code 143 (killed by SIGTERM); after: {first}")
    assert "handoff/baselines/identity/v404" in first and "Error" in first.split(":")[0], first
    assert "FAILED" in first and first.index("Error") < first.index("(Slurm job"), first
    assert "Connection closed by peer" not in first and "ChildFailedError" not in first
