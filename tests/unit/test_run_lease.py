"""drape.storage.lease on a file:// store: one process drives a run; a second start is refused
naming the holder and the expiry; a killed holder's run is taken at once, an expired lease by anyone."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drape.storage.lease import LeaseLost, RunHeld, acquire, lease_key
from drape.storage.store import ObjectStore

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path):
    return ObjectStore(f"file://{tmp_path / 'objects'}")


def _record(store: ObjectStore, run_id: str) -> dict:
    return json.loads(store.read_bytes(lease_key(run_id)))


def test_a_second_start_is_refused_naming_the_run_the_holder_and_the_expiry(store):
    first = acquire(store, "run-a", seconds=30, flow_run_id="flow-1")
    try:
        with pytest.raises(RunHeld) as refused:
            acquire(store, "run-a", seconds=30, flow_run_id="flow-2")
        message = str(refused.value)
        assert f"run run-a is already being driven by pid {os.getpid()} on " in message
        assert "flow run flow-1" in message and "its lease runs until 20" in message and " UTC (in " in message
        assert _record(store, "run-a")["holder"]["token"] == first.holder.token  # the refusal changed nothing
    finally:
        first.release()
    assert not store.exists(lease_key("run-a"))  # released: the next start takes it at once
    acquire(store, "run-a", seconds=30, flow_run_id="flow-2").release()


def test_a_retry_of_the_same_flow_run_in_the_same_process_takes_its_own_lease(store, capsys):
    first = acquire(store, "run-b", seconds=30, flow_run_id="flow-1")
    again = acquire(store, "run-b", seconds=30, flow_run_id="flow-1")  # Prefect's retry of the flow run
    assert "a retry of the same flow run in the same process" in capsys.readouterr().out
    assert not first.renew() and "taken over" in (first.lost or "")  # the first try's heartbeat stops
    with pytest.raises(LeaseLost, match="run run-b: its lease was taken over by pid"):
        first.check()
    again.release()


def test_an_expired_lease_is_taken_and_the_old_holder_learns_it_lost(store, capsys):
    now = [1_000_000.0]
    first = acquire(store, "run-c", seconds=10, flow_run_id="flow-1", clock=lambda: now[0])
    first._stop.set()  # its heartbeat stopped (a node lost), as far as this test goes
    now[0] += 9
    with pytest.raises(RunHeld):
        acquire(store, "run-c", seconds=10, flow_run_id="flow-2", clock=lambda: now[0])
    now[0] += 2
    second = acquire(store, "run-c", seconds=10, flow_run_id="flow-2", clock=lambda: now[0])
    assert "it expired at" in capsys.readouterr().out
    assert not first.renew()  # its ETag is stale: the conditional write is refused
    assert _record(store, "run-c")["holder"]["token"] == second.holder.token
    first.release()  # deletes nothing: the lease is not its own any more
    assert _record(store, "run-c")["holder"]["token"] == second.holder.token
    second.release()


def test_a_killed_holder_on_this_host_is_taken_over_at_once(store, capsys):
    code = (
        "import sys, time; from drape.storage.store import ObjectStore; from drape.storage.lease import acquire; "
        f"acquire(ObjectStore({store.url!r}), 'run-d', seconds=600, flow_run_id='dead'); print('held', flush=True); "
        "time.sleep(600)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(RunHeld, match=f"pid {child.pid} on .*flow run dead"):
            acquire(store, "run-d", seconds=30)  # alive: refused
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    lease = acquire(store, "run-d", seconds=30)  # its lease had 600 s left: taken because the pid is gone
    assert f"its process {child.pid} on this host is gone" in capsys.readouterr().out
    lease.release()


def test_a_holder_on_another_host_is_waited_out_and_a_damaged_record_counts_as_expired(store):
    first = acquire(store, "run-e", seconds=30, flow_run_id="flow-1")
    first._stop.set()
    record = _record(store, "run-e")
    record["holder"] = {**record["holder"], "host": "node-b", "pid": 1}
    store.put_bytes(json.dumps(record).encode(), lease_key("run-e"))  # node-b's process: not seen from here
    with pytest.raises(RunHeld, match="pid 1 on node-b, flow run flow-1"):
        acquire(store, "run-e", seconds=30)
    store.put_bytes(b'{"holder": 3, "expires_at": NaN}', lease_key("run-e"))
    acquire(store, "run-e", seconds=30).release()


def _race(url: str, start: float, results) -> None:
    time.sleep(max(start - time.time(), 0))
    try:
        lease = acquire(ObjectStore(url), "run-race", seconds=30, flow_run_id=f"flow-{os.getpid()}")
        results.put(("won", lease.holder.pid))
        time.sleep(1.0)  # held while the others read it
    except RunHeld:
        results.put(("refused", os.getpid()))


def test_of_four_processes_started_at_once_exactly_one_drives_the_run(store):
    context = multiprocessing.get_context("fork")
    results, start = context.Queue(), time.time() + 1.0
    racers = [context.Process(target=_race, args=(store.url, start, results)) for _ in range(4)]
    for racer in racers:
        racer.start()
    outcomes = [results.get(timeout=60) for _ in racers]
    for racer in racers:
        racer.join(timeout=60)
    assert sorted(outcome for outcome, _ in outcomes) == ["refused", "refused", "refused", "won"]


def test_a_resume_while_the_run_is_driven_is_refused_before_mlflow_is_touched(dag_config, one_stage):
    from drape.pipeline import RunContext
    from drape.pipeline.resume import save_context
    from drape.pipeline.run import release_flow_run_leases, resources, start_run
    from drape.storage.store import open_store

    context, *_ = one_stage
    store = open_store(dag_config)
    open_copy = dataclasses.replace(context, run_id="20260101-000000-lease0")
    save_context(store, open_copy, dag_config.name, None)
    first = start_run(dag_config, resume=open_copy.run_id, flow_run_id="first")
    assert isinstance(first, RunContext) and first.resumed
    with pytest.raises(RunHeld, match=f"run {open_copy.run_id} is already being driven by .*flow run first"):
        start_run(dag_config, resume=open_copy.run_id, flow_run_id="second")
    assert release_flow_run_leases("first") == [open_copy.run_id]  # the failed flow's hook
    second = start_run(dag_config, resume=open_copy.run_id, flow_run_id="second")  # at once after a release
    store.put_bytes(b"{}", lease_key(open_copy.run_id))  # taken by "someone" (a damaged record: expired)
    acquire(store, open_copy.run_id, seconds=30).release()  # someone else took the run over meanwhile
    from drape.pipeline.run import _LEASES

    assert not _LEASES[second.run_id].renew()
    with pytest.raises(LeaseLost):
        resources(dag_config, second)  # no step of this process touches the run any more
    release_flow_run_leases("second")
