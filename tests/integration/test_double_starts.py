"""Double starts of one run (issue 68): refused, never run twice.

- The lease on a real S3 API (moto over HTTP): S3's conditional writes refuse a second create and a
  stale renewal, and of four processes started at once exactly one drives the run.
- `drape run --resume RUN` while another process drives RUN: exit 2, naming the run, the holder
  and when its lease expires, with no retry of the refusal.
- Two nodes that share only the object store (another host name, `unshare --uts`): a holder killed
  on the other node cannot be proven dead from here, so its run is taken once its lease expires.
- The queue's own guard: a run's stage job submitted by four processes at once is queued once, on
  SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from drape.storage.lease import RunHeld, acquire, lease_key
from drape.storage.store import ObjectStore
from tests.conftest import tiny_config

REPO = Path(__file__).resolve().parents[2]
HOLD = (
    "import sys, time; from drape.storage.store import ObjectStore; from drape.storage.lease import acquire; "
    "store = ObjectStore(sys.argv[1], endpoint_url=sys.argv[4] or None, region='us-east-1'); "
    "acquire(store, sys.argv[2], seconds=float(sys.argv[3]), flow_run_id='first'); print('held', flush=True); "
    "time.sleep(600)"
)


def _holder(url: str, run_id: str, seconds: float, endpoint: str = "", prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    """A process on its own that takes `run_id`'s lease and holds it (the first start)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [*prefix, sys.executable, "-c", HOLD, url, run_id, str(seconds), endpoint]
    child = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def _kill(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)


# --- S3 -------------------------------------------------------------------------------------------
def test_s3_conditional_writes_refuse_a_second_create_and_a_stale_renewal(s3_bucket):
    import boto3
    from botocore.exceptions import ClientError

    bucket, endpoint = s3_bucket
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.put_object(Bucket=bucket, Key="probe", Body=b"1", IfNoneMatch="*")
    with pytest.raises(ClientError, match="PreconditionFailed"):  # what the lease's create relies on
        client.put_object(Bucket=bucket, Key="probe", Body=b"2", IfNoneMatch="*")
    assert client.get_object(Bucket=bucket, Key="probe")["Body"].read() == b"1"  # read back: unchanged

    store = ObjectStore(f"s3://{bucket}/objects", endpoint_url=endpoint, region="us-east-1")
    first = acquire(store, "run-s3", seconds=30, flow_run_id="flow-1")
    with pytest.raises(RunHeld, match="run run-s3 is already being driven by .*flow run flow-1"):
        acquire(store, "run-s3", seconds=30, flow_run_id="flow-2")
    stale = first.tag
    assert first.renew() and first.tag != stale  # a renewal is a new object (a new ETag)
    first.tag = stale
    assert not first.renew() and first.lost  # If-Match on the old ETag: refused, the holder knows it lost
    first.release()  # deletes nothing: If-Match fails
    assert json.loads(store.read_bytes(lease_key("run-s3")))["holder"]["flow_run"] == "flow-1"
    store.fs.rm(store.path(lease_key("run-s3")))


def _race(url: str, endpoint: str, ready, go, results, answered) -> None:
    store = ObjectStore(url, endpoint_url=endpoint, region="us-east-1")
    ready.put(os.getpid())
    go.wait(timeout=120)  # every racer imported and connected: they start together
    try:
        acquire(store, "run-race", seconds=30, flow_run_id=f"flow-{os.getpid()}")
        results.put("won")
        answered.wait(timeout=120)  # alive, holding the lease, until every racer has tried
    except RunHeld:
        results.put("refused")


def _all_at_once(target, *args) -> list:
    """Four processes of `target(*args, ready, go, results, answered)` released together; what each
    put in results (`answered` is set once all four have)."""
    context = multiprocessing.get_context("spawn")
    ready, go, results, answered = context.Queue(), context.Event(), context.Queue(), context.Event()
    racers = [context.Process(target=target, args=(*args, ready, go, results, answered)) for _ in range(4)]
    for racer in racers:
        racer.start()
    for _ in racers:
        ready.get(timeout=240)
    go.set()
    outcomes = [results.get(timeout=120) for _ in racers]
    answered.set()
    for racer in racers:
        racer.join(timeout=60)
    return outcomes


def test_of_four_processes_starting_one_run_on_s3_exactly_one_drives_it(s3_bucket):
    bucket, endpoint = s3_bucket
    assert sorted(_all_at_once(_race, f"s3://{bucket}/objects", endpoint)) == ["refused", "refused", "refused", "won"]


# --- drape run --resume while the run is driven --------------------------------------------------
def _open_run(tmp_path: Path, run_id: str):
    """A config file and an open run of it in the store (what `--resume` looks for)."""
    from drape.pipeline import RunContext
    from drape.pipeline.resume import save_context

    config = tiny_config(tmp_path / "drape")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    context = RunContext(run_id, run_id, "full", str(tmp_path), "m", {}, "datasets/x", "h", "control")
    save_context(ObjectStore(config.object_store_url), context, config.name, None)
    return config, path


def test_drape_run_resume_of_a_driven_run_exits_2_naming_the_holder(tmp_path):
    from drape.cli import app

    run_id = "20260101-000000-double"
    config, path = _open_run(tmp_path, run_id)
    holder = _holder(config.object_store_url, run_id, 60)
    try:
        result = CliRunner().invoke(app, ["run", "--config", str(path), "--resume", run_id])
    finally:
        _kill(holder)
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())
    assert f"run {run_id} is already being driven by pid {holder.pid} on" in flat
    assert "flow run first" in flat and "its lease runs until" in flat and "Traceback" not in result.output
    acquire(ObjectStore(config.object_store_url), run_id, seconds=30).release()  # killed on this host: taken at once


def test_a_flow_run_that_meets_a_driven_run_is_refused_once_not_retried(prefect_harness, tmp_path, monkeypatch):
    """Two flow runs that pass the CLI's check together: the flow's own start decides, and its
    refusal is not retried (start-run retries a failure on the way, not a refusal)."""
    from drape import pipeline
    from flows.staged_training import staged_training

    run_id = "20260101-000000-racing"
    config, path = _open_run(tmp_path, run_id)
    starts, real_start = [], pipeline.start_run
    monkeypatch.setattr(pipeline, "start_run", lambda *args, **kwargs: starts.append(1) or real_start(*args, **kwargs))
    holder = _holder(config.object_store_url, run_id, 60)
    try:
        with pytest.raises(RunHeld, match=f"run {run_id} is already being driven by pid {holder.pid}"):
            staged_training(config_path=str(path), resume=run_id)
    finally:
        _kill(holder)
    assert starts == [1]


# --- two nodes ------------------------------------------------------------------------------------
def test_a_holder_killed_on_another_node_is_waited_out_then_taken(tmp_path, capsys):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("the other node is a UTS namespace of its own (another host name): it needs root and unshare")
    url = f"file://{tmp_path / 'objects'}"
    store = ObjectStore(url)
    node_b = ["unshare", "--uts", "sh", "-c", 'hostname node-b && exec "$@"', "node-b"]
    holder = _holder(url, "run-nodes", 2, prefix=tuple(node_b))  # a lease of 2 s: the wait below
    with pytest.raises(RunHeld, match=f"pid {holder.pid} on node-b"):
        acquire(store, "run-nodes", seconds=30)
    _kill(holder)  # the node lost: nothing here can see that its process is gone
    expires_at = json.loads(store.read_bytes(lease_key("run-nodes")))["expires_at"]
    with pytest.raises(RunHeld, match="node-b"):
        acquire(store, "run-nodes", seconds=30)
    deadline = time.time() + 30
    while True:  # a bounded wait for the lease to run out (renewed never again)
        try:
            lease = acquire(store, "run-nodes", seconds=30)
            break
        except RunHeld:
            assert time.time() < deadline, "the dead node's lease was never taken"
            time.sleep(0.2)
    assert time.time() >= expires_at
    assert "it expired at" in capsys.readouterr().out
    lease.release()


# --- the queue's own dedupe ------------------------------------------------------------------------
def _submit(url: str, spec, ready, go, results, answered) -> None:
    from scheduler.queue.store import JobStore

    store = JobStore(url)
    ready.put(os.getpid())
    go.wait(timeout=120)
    results.put(store.submit(spec))


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_runs_stage_job_submitted_by_four_processes_at_once_is_queued_once(request, tmp_path, database):
    from scheduler.jobs.training import train_job_spec
    from scheduler.queue.store import JobStore

    url = f"sqlite:///{tmp_path}/queue.db"
    if database == "postgresql":
        import sqlalchemy

        server, name = request.getfixturevalue("postgres_url"), f"once_{uuid.uuid4().hex[:8]}"
        with sqlalchemy.create_engine(server, isolation_level="AUTOCOMMIT").connect() as connection:
            connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
        url = server.rsplit("/", 1)[0] + f"/{name}"
    JobStore(url)  # the tables, before the racers
    spec = train_job_spec(tiny_config(tmp_path / "drape"), stage="texture", mode="full", run_id="run-q", command=["true"])
    ids = set(_all_at_once(_submit, url, spec))
    assert len(ids) == 1 and [job["id"] for job in JobStore(url).jobs()] == list(ids)
