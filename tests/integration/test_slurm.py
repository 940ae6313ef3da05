"""Slurm as drape's engine, on a real slurmctld and two slurmd (tests/integration/slurm_cluster.py).

Each slurmd runs in a mount namespace of its own (tests/integration/nodes.py) with its own
directory bound over drape's live root, so the job steps on n1 and on n2 share no disk: the
object store (a moto S3 server over HTTP) is all they share with each other and with the flow.
A stage job is 2 nodes × 2 gloo ranks (test 3: × 1): sbatch → srun → torchrun with a c10d rendezvous at the
allocation's first node. The queue (SQLite) and its dispatcher are drape's; Slurm runs the job
where drape placed it (--nodelist, --gres=gpu:2).

1. a stage job trains, checkpoints (sharded, through the store), and its result reaches the flow;
2. USR1 (what --signal=B:USR1@N sends before the time limit) to the batch script: the trainer
   checkpoints and exits, the job is requeued, resumes, and ends with test 1's weights (trained
   again here when test 1 did not run first in this process);
3. one node's slurmd and steps are killed mid-job (a job of one rank on each node): Slurm (told
   --requeue) requeues the job, which runs again once the node is back (its disk empty) and resumes
   from the store; the queue job is submitted once and its two runs never overlap;
4. the dispatcher is SIGKILLed and a new one adopts the running Slurm job (one sbatch in all);
5. a job whose memory profile fits no node is refused at submit, with why; and a fleet that says
   a node has more GPUs than Slurm's gres is refused at launch, naming both counts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import yaml

from drape.layout import checkpoint_step
from drape.ops import metrics
from drape.storage.handoff import fetch_checkpoint, newest_published, result_key
from drape.storage.store import open_store
from drape.training.checkpoints.checkpoint import load_model
from drape.training.jobs.stage_job import StageJob
from scheduler.dispatch.accounting import run_attempts
from scheduler.dispatch.dispatcher import submit_and_wait
from scheduler.jobs.training import train_job_spec
from scheduler.queue.store import JobSpec, JobStore, QueueError
from tests.conftest import quiet_ports, tiny_config, wait_until
from tests.integration.nodes import Nodes
from tests.integration.slurm_cluster import NODES, SlurmCluster, slurm_installed

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS = 24
JOB_TIMEOUT = 240.0


def _fleet(path: Path, gpus_per_node: int = 2, memory_gib: float = 16) -> str:
    """drape's static fleet: the Slurm nodes (slurm-00, slurm-01), 2 CPU 'GPUs' of 16 GiB each."""
    group = {
        "model": "cpu",
        "memory_gib": memory_gib,
        "nodes": len(NODES),
        "gpus_per_node": gpus_per_node,
        "node_prefix": "slurm",
    }
    path.write_text(yaml.safe_dump({"groups": [group]}))
    return str(path)


@pytest.fixture
def cluster(tmp_path, s3_bucket, monkeypatch):
    """(config, SlurmCluster, Nodes): Slurm up with each slurmd in its node's mount namespace."""
    if why := slurm_installed():
        pytest.fail(why)
    bucket, endpoint = s3_bucket
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the jobs import this checkout (job_environment passes PYTHON*)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = _config(tmp_path, bucket, endpoint, _fleet(tmp_path / "fleet.yaml"))
    nodes = Nodes(tmp_path, [Path(config.paths.root).resolve() / "live"])
    for node in NODES:
        nodes.add(node)
    # a short root: slurmstepd's Unix sockets live under the spool and must stay under 108 bytes,
    # which pytest's own folders (popen-gwN/test_…) exceed under xdist
    short = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    slurm = SlurmCluster(short, nodes)
    try:
        started = time.monotonic()
        slurm.start()
        print(f"slurm: munged, slurmctld and {len(NODES)} slurmd up in {time.monotonic() - started:.2f} s")
        monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
        yield config, slurm, nodes
    finally:
        print(slurm.logs(tail=20000))  # pytest shows a test's captured output only when it failed
        started = time.monotonic()
        slurm.run("scancel", "--full", "--user=root", check=False) if slurm.processes else None
        slurm.close()
        nodes.close()
        shutil.rmtree(short, ignore_errors=True)
        print(f"slurm: down in {time.monotonic() - started:.2f} s")


def _config(root: Path, bucket: str, endpoint: str, inventory: str, **queue):
    return tiny_config(
        root / "drape",
        storage={"object_store_url": f"s3://{bucket}/drape", "endpoint_url": endpoint},
        data={"shard_max_samples": 12},  # 4 shards of 48 samples: one partition per rank
        train={
            "gpus": 4,
            "data_partitions": 4,
            "parallelism": "fsdp",
            "async_checkpoint": True,
            "checkpoint_every": 6,
            "stages": {"identity": {"steps": STEPS, "trainable": ["*"]}},
        },
        queue={
            "enabled": True,
            "launcher": "slurm",
            "fleet": "static",
            "inventory": inventory,
            "max_jobs_per_gpu": 1,
            "poll_seconds": 0.3,
            "lease_seconds": 4,
            "max_attempts": 2,
            "slurm": {
                "accounting": "jobcomp",
                "rendezvous_port": quiet_ports(16),  # a requeued run takes port + restart % 16
                "cpus_per_gpu": 1,
                "time_limit_minutes": 30,
                "signal_seconds": 120,
                "rendezvous_timeout_seconds": 120,
            },
            **queue,
        },
    )


def _submit(config, run_id: str) -> JobSpec:
    command = StageJob(config, "identity", "unused", run_id=run_id, handoff=True).publish(open_store(config))
    return train_job_spec(config, stage="identity", mode="full", run_id=run_id, command=command)


def _weights(config, root: Path, run_id: str) -> dict[str, torch.Tensor]:
    """The stage's final checkpoint as the flow takes it: the published result, then its checkpoint, verified."""
    store = open_store(config)
    result = json.loads(store.read_bytes(result_key(run_id, "identity")))
    local = fetch_checkpoint(store, run_id, "identity", Path(result["checkpoint"]).name, root / "flow" / run_id)
    return load_model(local).state_dict()


def _slurm_runs(slurm: SlurmCluster) -> list[list[str]]:
    out = slurm.run("sacct", "-c", "-X", "-P", "-n", "-o", "JobID,JobName,State,Start,End", check=False)
    return [line.split("|") for line in out.splitlines() if "|drape-" in line]


def _running_job(store: JobStore) -> dict | None:
    rows = store.jobs(states=("running",))
    return rows[0] if rows and (rows[0]["handle"] or "").startswith("slurm:") else None


# the uninterrupted job's weights: test 1 trains it; test 2 compares with them (or trains it, run alone)
_UNINTERRUPTED: dict[str, dict[str, torch.Tensor]] = {}


def _reference(config, root: Path) -> dict[str, torch.Tensor]:
    if "whole" not in _UNINTERRUPTED:
        row = submit_and_wait(config, _submit(config, "whole"), timeout_s=JOB_TIMEOUT)
        assert row["state"] == "succeeded", row
        _UNINTERRUPTED["whole"] = _weights(config, root, "whole")
    return _UNINTERRUPTED["whole"]


def test_a_two_node_stage_job_trains_and_its_result_reaches_the_flow(cluster, tmp_path):
    config, slurm, nodes = cluster
    started = time.monotonic()
    row = submit_and_wait(config, _submit(config, "whole"), timeout_s=JOB_TIMEOUT)
    print(f"slurm: a 2-node × 2-rank stage job of {STEPS} steps in {time.monotonic() - started:.1f} s")
    assert row["state"] == "succeeded" and row["handle"].startswith("slurm:"), row
    assert sorted(json.loads(row["assigned"])) == ["slurm-00/gpu0", "slurm-00/gpu1", "slurm-01/gpu0", "slurm-01/gpu1"]
    script = next((Path(config.paths.root) / "queue" / "slurm").glob("*.sbatch")).read_text()
    assert "#SBATCH --nodelist=slurm-00,slurm-01" in script and "#SBATCH --gres=gpu:2" in script
    log = (Path(config.paths.root) / "queue" / "logs" / f"{row['id']}.log").read_text()
    assert "rendezvous 127.0.0.1:" in log
    result = json.loads(open_store(config).read_bytes(result_key("whole", "identity")))
    assert result["world_size"] == 4 and result["steps"] == STEPS
    assert result["node"] in NODES  # DRAPE_NODE: the Slurm node rank 0 ran on
    weights = _weights(config, tmp_path, "whole")
    assert weights and all(torch.isfinite(t).all() for t in weights.values())
    _UNINTERRUPTED["whole"] = weights
    for node in NODES:  # a node's disk is a cache: the finished stage left nothing there
        runs = nodes.disk(node) / "0" / "runs"
        assert not runs.exists() or not any(p.is_file() for p in runs.rglob("*")), node
    runs = _slurm_runs(slurm)
    assert [r[2] for r in runs] == ["COMPLETED"], runs


def test_usr1_before_the_time_limit_checkpoints_requeues_and_resumes_to_the_same_weights(cluster, tmp_path):
    config, slurm, _ = cluster
    reference = _reference(config, tmp_path)
    store, objects = JobStore(config.queue_url), open_store(config)
    from scheduler.dispatch.dispatcher import Dispatcher, wait_for

    dispatcher = Dispatcher(config, store)
    for attempt in range(3):
        run_id = "warned" if attempt == 0 else f"warned-{attempt}"
        job_id = store.submit(_submit(config, run_id))

        def launched(job_id: str = job_id) -> bool:
            dispatcher.cycle()
            return (store.get(job_id)["handle"] or "").startswith("slurm:")

        wait_until(launched, JOB_TIMEOUT, "the job handed to Slurm", every=0.3)
        # then the store alone, often: the signal must come before the job's last step
        wait_until(
            lambda run_id=run_id: newest_published(objects, run_id, "identity") is not None,
            JOB_TIMEOUT,
            "the job running with one checkpoint published",
            every=0.05,
        )
        slurm_id = store.get(job_id)["handle"].split(":")[1]
        slurm.run("scancel", "--batch", "--signal=USR1", slurm_id)  # what --signal=B:USR1@N delivers
        row = wait_for(config, store, job_id, timeout_s=JOB_TIMEOUT)
        log = (Path(config.paths.root) / "queue" / "logs" / f"{job_id}.log").read_text()
        runs = [r for r in _slurm_runs(slurm) if r[0] == slurm_id]
        if "requeueing job" in log or "trained to the end and published its result: the job is done" not in log:
            break
        # a loaded machine: the signal met the wrap-up after the last step. The job is done on its first
        # run (not failed and run again by the queue), and the requeue is tried again on a new job
        assert row["state"] == "succeeded" and row["attempts"] == 1, row
        assert [r[2] for r in runs] == ["COMPLETED"], runs
        print(f"slurm: USR1 came after {run_id}'s last step; the job ended as done; trying again")
    else:
        pytest.fail("USR1 came after the job's last step three times: the requeue path was not reached")
    assert row["state"] == "succeeded" and row["attempts"] == 1, row  # one queue attempt: Slurm requeued it
    assert "USR1: asking the trainer to save a checkpoint" in log and "requeueing job" in log, log[-3000:]
    result = json.loads(objects.read_bytes(result_key(run_id, "identity")))
    assert 0 < result["resumed_from_step"] < STEPS, result  # the step it was told to stop at
    assert [r[2] for r in runs][-1] == "COMPLETED" and len(runs) == 2, runs  # requeued once, then done
    attempts = run_attempts(store, run_id, config)  # the cost report's GPU time: both Slurm runs, from sacct
    assert [a.gpus for a in attempts] == [4, 4] and all(a.end is not None and a.end >= a.start for a in attempts), attempts
    labels = {"job_id": job_id, "engine": "slurm", "state": "COMPLETED"}
    assert (metrics.REGISTRY.get_sample_value("drape_engine_job_gpu_hours", labels) or 0) > 0
    resumed = _weights(config, tmp_path, run_id)
    worst = max(float((reference[name] - tensor).abs().max()) for name, tensor in resumed.items())
    assert worst == 0.0, f"the resumed job's weights differ from the uninterrupted job's by {worst}"


def test_a_node_killed_mid_job_is_requeued_and_resumes_never_running_twice(cluster, tmp_path):
    config, slurm, nodes = cluster
    # one rank on each node (2 trainers a run, not 4): a node's loss is the subject; tests 1 and 2 run 2 × 2
    one_per_node = config.queue.model_copy(update={"inventory": _fleet(tmp_path / "one-per-node.yaml", gpus_per_node=1)})
    config = config.model_copy(update={"train": config.train.model_copy(update={"gpus": 2}), "queue": one_per_node})
    store, objects = JobStore(config.queue_url), open_store(config)
    job_id = store.submit(_submit(config, "lost"))
    from scheduler.dispatch.dispatcher import Dispatcher, wait_for

    dispatcher = Dispatcher(config, store)

    def checkpointed() -> bool:
        dispatcher.cycle()
        newest = newest_published(objects, "lost", "identity")
        return newest is not None and checkpoint_step(newest) >= 6

    wait_until(checkpointed, JOB_TIMEOUT, "a whole checkpoint in the store")
    handle = store.get(job_id)["handle"]
    slurm_id = handle.split(":")[1]
    slurm.kill_node(NODES[1])  # its slurmd, its job steps, its disk

    def requeued() -> bool:
        dispatcher.cycle()  # the queue job stays running: Slurm, told --requeue, runs it again
        return "Restarts=1" in slurm.run("scontrol", "show", "job", "-o", slurm_id)

    wait_until(requeued, 120, "Slurm's requeue after the node failure")

    def pending_on_the_down_node() -> bool:
        dispatcher.cycle()  # the queue sees the requeued job waiting, and keeps it running
        job = slurm.run("scontrol", "show", "job", "-o", slurm_id)
        return "JobState=PENDING" in job and slurm.node_states().get(NODES[1], "").startswith("down")

    wait_until(pending_on_the_down_node, 60, f"the requeued job pending while Slurm has {NODES[1]} down")
    assert store.get(job_id)["state"] == "running"
    slurm.start_node(NODES[1])  # the node comes back empty (a fresh machine in its place)
    row = wait_for(config, store, job_id, timeout_s=JOB_TIMEOUT)
    assert row["state"] == "succeeded" and row["attempts"] == 1 and row["handle"] == handle, row
    result = json.loads(objects.read_bytes(result_key("lost", "identity")))
    assert result["resumed_from_step"] >= 6, result
    runs = _slurm_runs(slurm)
    assert [(r[0], r[2]) for r in runs] == [(slurm_id, "NODE_FAIL"), (slurm_id, "COMPLETED")], runs  # submitted once
    assert runs[0][4] <= runs[1][3], f"the rerun started before the failed run ended: {runs}"


def test_a_restarted_dispatcher_adopts_the_running_slurm_job(cluster, tmp_path):
    config, slurm, _ = cluster
    # one rank on one node: adoption is the subject, and three more ranks would only load the cores
    config = config.model_copy(update={"train": config.train.model_copy(update={"gpus": 1})})
    config_path = tmp_path / "drape.yaml"
    config_path.write_text(yaml.safe_dump({**config.model_dump(mode="json"), "queue": {**config.queue.model_dump(mode="json")}}))
    store = JobStore(config.queue_url)
    job_id = store.submit(_submit(config, "adopted"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def dispatcher(number: int) -> subprocess.Popen:
        log = open(tmp_path / f"dispatcher-{number}.log", "ab")
        argv = [str(Path(sys.executable).with_name("drape")), "queue", "dispatch", "--config", str(config_path)]
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    first = dispatcher(1)
    try:
        running = wait_until(lambda: _running_job(store), 60, "the job's launch")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        second = dispatcher(2)
        try:
            wait_until(lambda: store.get(job_id)["state"] == "succeeded", JOB_TIMEOUT, "the adopted job's end")
        finally:
            os.killpg(second.pid, signal.SIGTERM)
            second.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert "adopted" in (tmp_path / "dispatcher-2.log").read_text()
    assert store.get(job_id)["handle"] == running["handle"]
    assert len(_slurm_runs(slurm)) == 1  # submitted once


def test_a_job_no_node_can_hold_is_refused_and_a_fleet_slurm_disagrees_with_is_refused_at_launch(cluster, tmp_path):
    config, slurm, _ = cluster
    bucket, endpoint = config.storage.object_store_url.split("/")[2], config.storage.endpoint_url
    small = _config(tmp_path / "small", bucket, endpoint, _fleet(tmp_path / "small.yaml", memory_gib=0.5))
    spec = _submit(small, "huge")  # the stage's memory profile: more than a 0.5 GiB GPU holds
    with pytest.raises(QueueError, match=r"refused: no node of the fleet can hold it: it needs 4 GPU\(s\) with .* GiB each"):
        submit_and_wait(small, spec, timeout_s=30)
    wrong = _config(tmp_path / "wrong", bucket, endpoint, _fleet(tmp_path / "wrong.yaml", gpus_per_node=4))
    four = JobSpec(kind="stage-training", command=["true"], gpus=4, mem_gib=1.0, duration_s=60, stage="identity")
    with pytest.raises(QueueError, match=r"drape placed 4 GPU\(s\) on node slurm-00, but Slurm's gres there is gpu:2"):
        submit_and_wait(wrong, four, timeout_s=30)  # drape's fleet says 4 GPUs a node, Slurm's gres.conf 2
    assert _slurm_runs(slurm) == [] and not slurm.run("squeue", "-h").strip()  # nothing reached Slurm
