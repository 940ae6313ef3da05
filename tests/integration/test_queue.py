"""The durable queue with real processes: concurrent dispatchers, dead dispatchers, launchers, DCGM fleet."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import defaultdict

import pytest
import yaml

from scheduler.queue.store import JobSpec, JobStore
from tests.conftest import tiny_config, wait_until

pytestmark = pytest.mark.slow

FLEET = {
    "groups": [
        {"model": "H100-80GB", "memory_gib": 80, "nodes": 2, "gpus_per_node": 4, "node_prefix": "h100"},
        {"model": "L40S-48GB", "memory_gib": 48, "nodes": 1, "gpus_per_node": 4, "node_prefix": "l40s"},
    ]
}

DISPATCH = textwrap.dedent("""
    import sys, time
    from drape.config import load_config
    from scheduler.dispatch.dispatcher import Dispatcher
    config = load_config(sys.argv[1])
    dispatcher = Dispatcher(config)
    deadline = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < deadline:
        dispatcher.cycle()
        counts = dispatcher.store.counts()
        if sys.argv[3] == "drain" and counts["queued"] == 0 and counts["running"] == 0:
            break
        time.sleep(config.queue.poll_seconds)
""")


def _config_file(tmp_path, **queue):
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(FLEET))
    config = tiny_config(
        tmp_path / "drape", queue={"fleet": "static", "inventory": str(tmp_path / "fleet.yaml"), "poll_seconds": 0.02, **queue}
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return config, path


def _dispatchers(path, count, seconds, mode="drain"):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return [subprocess.Popen([sys.executable, "-c", DISPATCH, str(path), str(seconds), mode], env=env) for _ in range(count)]


def _until(go, starts) -> str:
    """A job that says it started, runs until the test creates `go` (a wait on the event, not a fixed
    sleep the test must outlast), then exits 3."""
    return f"echo started >> {starts}; while [ ! -e {go} ]; do sleep 0.05; done; exit 3"


def _dispatch_until_done(dispatcher, store, job_id: str, timeout: float, pause: float) -> dict:
    """Cycle `dispatcher` until the job leaves queued and running; its row."""
    deadline = time.monotonic() + timeout
    while store.get(job_id)["state"] in ("queued", "running"):
        assert time.monotonic() < deadline, f"job {job_id} still {store.get(job_id)['state']} after {timeout:.0f} s"
        dispatcher.cycle()
        time.sleep(pause)
    return store.get(job_id)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_dispatchers_starting_together_register_the_fleet_once(tmp_path, request, monkeypatch, database):
    """Two dispatchers read the inventory before either inserts it: the second one's insert skips
    the rows the first one wrote instead of failing on the primary key (it used to crash a
    dispatcher at start-up on PostgreSQL)."""
    import scheduler.queue.store as store_module
    from scheduler.policy import GpuState

    queue = {"url": request.getfixturevalue("postgres_url")} if database == "postgresql" else {}
    config, _ = _config_file(tmp_path, **queue)
    first, second = JobStore(config.queue_url), JobStore(config.queue_url)
    gpus = [GpuState(f"n0/gpu{i}", "n0", "H100-80GB", 80.0) for i in range(4)]
    first.register_gpus(gpus[:3])
    real_select = store_module.select
    # the second dispatcher's read happened before the first one's insert: it sees no GPUs
    monkeypatch.setattr(
        store_module, "select", lambda *columns: real_select(*columns).where(store_module.gpus_table.c.uuid == "")
    )
    second.register_gpus(gpus)
    monkeypatch.setattr(store_module, "select", real_select)
    assert sorted(g.uuid for g in second.inventory()) == [g.uuid for g in gpus]


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_claim_returns_the_rows_it_left(tmp_path, request, database):
    """The rows `claim_rows` hands the launcher are the rows the database holds after the claim,
    column for column; a placement the ledger refuses comes back with none."""
    import sqlalchemy

    from scheduler.policy import GpuState, Placement

    queue = {}
    if database == "postgresql":  # a database of its own: the jobs it leaves would be other tests' jobs
        server, name = request.getfixturevalue("postgres_url"), f"claims_{uuid.uuid4().hex[:8]}"
        with sqlalchemy.create_engine(server, isolation_level="AUTOCOMMIT").connect() as connection:
            connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
        queue = {"url": server.rsplit("/", 1)[0] + f"/{name}"}
    config, _ = _config_file(tmp_path, **queue)
    store = JobStore(config.queue_url)
    node = "n0"
    store.register_gpus([GpuState(f"{node}/gpu{i}", node, "H100-80GB", 80.0) for i in range(3)])
    spec = {"kind": "gate-eval", "duration_s": 60, "command": ["true"]}
    small = store.submit(JobSpec(mem_gib=30, labels={"run": "r1"}, **spec))
    gang = store.submit(JobSpec(mem_gib=40, gpus=2, **spec))
    too_big = store.submit(JobSpec(mem_gib=60, exclusive=True, **spec))
    placements = [Placement(small, (f"{node}/gpu0",), 30), Placement(too_big, (f"{node}/gpu0",), 60)]
    granted = store.claim_rows(placements, "d1", 30.0, 4, now=1000.0)
    assert [(p.job_id, row) for p, row in granted] == [(small, store.get(small))]
    assert store.get(small)["attempts"] == 1 and store.get(small)["assigned"] == json.dumps([f"{node}/gpu0"])
    ((placement, row),) = store.claim_rows([Placement(gang, (f"{node}/gpu1", f"{node}/gpu2"), 40)], "d2", 30.0, 4, now=1001.0)
    assert row == store.get(gang) and row["dispatcher"] == "d2" and row["lease_expires_s"] == 1031.0


@pytest.mark.parametrize("database, jobs", [("sqlite", 1000), ("postgresql", 400)])
def test_four_dispatchers_never_double_allocate(tmp_path, request, database, jobs):
    queue = {"url": request.getfixturevalue("postgres_url")} if database == "postgresql" else {}
    config, path = _config_file(tmp_path, **queue)
    store = JobStore(config.queue_url)
    rng = random.Random(0)
    kinds = ("finetune", "gate-eval", "inference-benchmark", "personalization")
    for index in range(jobs):
        store.submit(
            JobSpec(
                kind=rng.choice(kinds),
                command=["true"],
                mem_gib=rng.uniform(5, 70),
                duration_s=rng.uniform(1, 30),
                gpus=2 if index % 50 == 0 else 1,
                priority=rng.randint(1, 6),
            )
        )
    processes = _dispatchers(path, 4, 300)
    for process in processes:
        assert process.wait(timeout=330) == 0
    assert store.counts()["succeeded"] == jobs
    jobs = store.jobs()
    assert all(job["attempts"] == 1 for job in jobs)  # nobody launched a job twice
    assert len({job["dispatcher"] for job in jobs}) == 4  # all four did work
    totals = {g.uuid: g.total_gib for g in store.inventory()}
    used, claimed = defaultdict(float), defaultdict(int)
    for event in store.allocation_events():  # replay the ledger in commit order
        sign = 1 if event["event"] == "claim" else -1
        used[event["gpu_uuid"]] += sign * event["mem_gib"]
        claimed[event["job_id"]] += sign
        assert used[event["gpu_uuid"]] <= totals[event["gpu_uuid"]] + 1e-6, event
    assert all(value == 0 for value in claimed.values()) and store.ledger() == {}


def test_recording_handles_cannot_deadlock_a_rivals_claim(postgres_url):
    """A dispatcher records its launched jobs' handles while a rival's claim locks the same rows
    (the rival's plan was stale). Both take the rows in key order, so one waits for the other;
    in launch order they deadlocked and PostgreSQL killed a dispatcher (seen in CI)."""
    import threading

    from sqlalchemy import select, text

    from scheduler.queue.schema import jobs_table

    store = JobStore(postgres_url)
    first, second = sorted(store.submit(JobSpec(kind="gate-eval", command=["true"], mem_gib=1, duration_s=1)) for _ in "ab")
    errors: list[BaseException] = []

    def record():
        try:
            store.set_handles({second: "pid:2", first: "pid:1"})  # launch order is not key order
        except BaseException as error:  # noqa: BLE001 - reported by the test's thread below
            errors.append(error)

    with store.engine.connect() as rival, rival.begin():
        lock = select(jobs_table.c.id).with_for_update()
        rival.execute(lock.where(jobs_table.c.id == first))  # the rival claim's first row
        thread = threading.Thread(target=record)
        thread.start()
        deadline = time.monotonic() + 20
        waiting = text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        while True:
            rival.execute(text("SELECT pg_stat_clear_snapshot()"))  # else the transaction sees one snapshot
            if rival.execute(waiting).scalar():
                break
            assert time.monotonic() < deadline, "set_handles never waited on the rival's lock"
            time.sleep(0.05)
        rival.execute(lock.where(jobs_table.c.id == second))  # its second row: a deadlock if set_handles holds it
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors, errors
    assert {job_id: row["handle"] for job_id, row in store.get_many([first, second]).items()} == {
        first: "pid:1",
        second: "pid:2",
    }


def test_a_restarted_dispatcher_adopts_the_job_its_predecessor_launched(tmp_path):
    """SIGKILL the dispatcher while its job runs: the next dispatcher adopts the job's process (by
    pid and start time) once the lease lapses, reaps it with its exit status, and never launches it
    again: one start in the job's log, one claim in the allocation log."""
    config, path = _config_file(tmp_path, lease_seconds=2.0)
    starts, go = tmp_path / "starts", tmp_path / "go"
    store = JobStore(config.queue_url)
    job_id = store.submit(JobSpec(kind="finetune", mem_gib=20, duration_s=60, command=["sh", "-c", _until(go, starts)]))
    (first,) = _dispatchers(path, 1, 60, mode="forever")
    wait_until(lambda: store.get(job_id)["state"] == "running" and starts.exists(), 60, "the job to start")
    predecessor = store.get(job_id)["dispatcher"]
    first.send_signal(signal.SIGKILL)
    first.wait()
    (second,) = _dispatchers(path, 1, 60)
    wait_until(lambda: store.get(job_id)["dispatcher"] != predecessor, 60, "the next dispatcher to adopt the job")
    go.touch()  # adopted while it runs: now it may end
    assert second.wait(timeout=90) == 0
    job = store.get(job_id)
    assert job["state"] == "failed" and job["exit_code"] == 3 and job["attempts"] == 1, job  # its own status, reaped
    assert starts.read_text().splitlines() == ["started"]
    events = store.allocation_events()
    assert [e["event"] for e in events] == ["claim", "release"] and events[0]["dispatcher"] != events[1]["dispatcher"]


def test_a_job_started_by_a_dispatcher_that_died_before_recording_it_is_found_not_run_twice(tmp_path):
    """The window between a launch and the handle's write: the job runs and the store has no handle.
    The next dispatcher finds the process by its `DRAPE_JOB_ID` and adopts it rather than requeue it
    (which would start it a second time beside the first)."""
    from scheduler.dispatch.dispatcher import Dispatcher
    from scheduler.engines.local.launcher import LocalLauncher

    config, _ = _config_file(tmp_path, lease_seconds=2.0)
    store = JobStore(config.queue_url)
    starts, go = tmp_path / "starts", tmp_path / "go"
    job_id = store.submit(JobSpec(kind="finetune", mem_gib=20, duration_s=60, command=["sh", "-c", _until(go, starts)]))
    dispatcher = Dispatcher(config, store, launcher=LocalLauncher(tmp_path / "logs"))
    plan = dispatcher.plan(store.pending(), dispatcher.fleet().gpus, [], 0.0, dispatcher.policy)
    ((placement, row),) = store.claim_rows(plan, "died-after-launch", 2.0, 4, now=time.time())
    LocalLauncher(tmp_path / "logs").launch(row, [g for g in dispatcher.fleet().gpus if g.uuid in placement.gpus])
    assert store.get(job_id)["handle"] is None
    report = dispatcher.cycle(now=time.time() + 10.0)
    assert report.adopted == [job_id] and not report.requeued and store.get(job_id)["handle"].startswith("pid:")
    go.touch()
    job = _dispatch_until_done(dispatcher, store, job_id, timeout=30, pause=0.05)
    assert job["state"] == "failed" and job["exit_code"] == 3 and job["attempts"] == 1, job
    assert starts.read_text().splitlines() == ["started"]
    assert LocalLauncher(tmp_path / "logs").find_job(job_id) is None  # ended: nothing left to find


def test_a_stale_job_no_launcher_sees_is_requeued_and_leases_are_compare_and_set(tmp_path):
    from scheduler.dispatch.dispatcher import Dispatcher

    config, _ = _config_file(tmp_path, lease_seconds=2.0)
    store = JobStore(config.queue_url)
    dispatcher = Dispatcher(config, store)
    unseen, finished, renewed = (
        store.submit(JobSpec(kind="finetune", mem_gib=10, duration_s=60, command=["true"])) for _ in range(3)
    )
    plan = dispatcher.plan(store.pending(), dispatcher.fleet().gpus, [], 0.0, dispatcher.policy)
    assert len(store.claim_many(plan, "gone-dispatcher", 2.0, 4, now=0.0)) == 3
    store.set_handles({job: "pid:1:1:another-host" for job in (unseen, finished, renewed)})
    stale = {job["id"]: job for job in store.stale(now=10.0)}
    assert set(stale) == {unseen, finished, renewed}
    store.finish(finished, exit_code=0, dispatcher="gone-dispatcher", now=11.0)  # it ended meanwhile ...
    store.heartbeat("gone-dispatcher", 100.0, now=11.0)  # ... and the others were renewed
    assert not store.requeue(stale[finished], now=12.0) and store.get(finished)["state"] == "succeeded"
    assert not store.requeue(stale[renewed], now=12.0) and store.get(renewed)["state"] == "running"
    assert not store.adopt(stale[renewed], "me", 2.0, now=12.0) and store.get(renewed)["dispatcher"] == "gone-dispatcher"
    store.heartbeat("nobody", 2.0, now=200.0)
    report = dispatcher.cycle(now=200.0)  # both lapsed: a host this dispatcher cannot see → back to the queue
    assert sorted(report.requeued) == sorted([unseen, renewed]) and not report.adopted
    assert (
        store.get(unseen)["state"] in ("queued", "running") and "no dispatcher sees its process" in store.get(unseen)["message"]
    )


def test_a_failed_job_is_retried_up_to_max_attempts(tmp_path):
    from scheduler.dispatch.dispatcher import Dispatcher

    config, _ = _config_file(tmp_path, max_attempts=3)
    store = JobStore(config.queue_url)
    counter = tmp_path / "runs"
    job_id = store.submit(
        JobSpec(kind="finetune", mem_gib=10, duration_s=5, command=["sh", "-c", f"echo x >> {counter}; exit 1"])
    )
    job = _dispatch_until_done(Dispatcher(config, store), store, job_id, 60, 0.05)
    assert job["state"] == "failed" and job["attempts"] == 3 and len(counter.read_text().split()) == 3
    assert "exit code 1" in job["message"]


def test_a_torchrun_job_runs_one_rank_per_gpu(tmp_path):
    from scheduler.dispatch.dispatcher import Dispatcher

    config, _ = _config_file(tmp_path)
    store = JobStore(config.queue_url)
    script = tmp_path / "rank.py"
    # one write() each: print's pieces, unbuffered under torchrun, interleaved once in the shared log
    script.write_text("import os\nos.write(1, f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}\\n\".encode())\n")
    job_id = store.submit(
        JobSpec(
            kind="stage-training",
            command=[sys.executable, str(script)],
            mem_gib=10,
            gpus=2,
            duration_s=10,
            labels={"launch": "torchrun"},
        )
    )
    job = _dispatch_until_done(Dispatcher(config, store), store, job_id, 120, 0.1)
    log = (tmp_path / "drape" / "queue" / "logs" / f"{job_id}.log").read_text()
    assert job["state"] == "succeeded", job["message"]
    assert "rank 0 of 2" in log and "rank 1 of 2" in log


def test_local_launcher_sets_cuda_visible_devices_and_records_peak_memory(tmp_path):
    from scheduler.dispatch.dispatcher import Dispatcher

    config, _ = _config_file(tmp_path)
    store = JobStore(config.queue_url)
    script = (
        "import json, os; json.dump({'peak_memory_gib': 3.5}, open(os.environ['DRAPE_JOB_RESULT'], 'w')); "
        "print('devices', repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    )
    job_id = store.submit(
        JobSpec(kind="stage-training", command=[sys.executable, "-c", script], mem_gib=70, gpus=4, duration_s=10, shape="shape-x")
    )
    dispatcher = Dispatcher(config, store)
    for _ in range(200):
        dispatcher.cycle()
        if store.get(job_id)["state"] != "running" and store.get(job_id)["state"] != "queued":
            break
        time.sleep(0.05)
    job = store.get(job_id)
    assert job["state"] == "succeeded", job["message"]
    assert sorted(json.loads(job["assigned"])) == [f"h100-00/gpu{i}" for i in range(4)] or sorted(
        json.loads(job["assigned"])
    ) == [f"h100-01/gpu{i}" for i in range(4)]
    log = (tmp_path / "drape" / "queue" / "logs" / f"{job_id}.log").read_text()
    assert "devices '0,1,2,3'" in log
    assert store.measurements("shape-x")[0][0] == 3.5


def test_cli_submit_list_cancel(tmp_path):
    from typer.testing import CliRunner

    from drape.cli import app

    _, path = _config_file(tmp_path)
    runner = CliRunner()
    submitted = runner.invoke(
        app, ["queue", "submit", "--kind", "gate-eval", "--mem-gib", "12", "--config", str(path), "--", "echo", "hi"]
    )
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.output.strip().splitlines()[-1]
    listed = runner.invoke(app, ["queue", "list", "--config", str(path)])
    assert job_id in listed.output and "queued" in listed.output
    cancelled = runner.invoke(app, ["queue", "cancel", job_id, "--config", str(path)])
    assert cancelled.exit_code == 0 and "cancelled" in cancelled.output
    missing = runner.invoke(app, ["queue", "cancel", "nope", "--config", str(path)])
    assert missing.exit_code == 2 and "no job 'nope'" in missing.output
    bad_kind = runner.invoke(app, ["queue", "submit", "--kind", "mining", "--mem-gib", "1", "--config", str(path), "--", "true"])
    assert bad_kind.exit_code == 2 and "unknown" in bad_kind.output


def test_fleet_from_dcgm_in_prometheus_and_fallback_to_the_ledger(tmp_path):
    from scheduler.dispatch.fleet import fleet_view
    from tests.conftest import DcgmExporter, start_prometheus, wait_for_series

    exporter = DcgmExporter(
        [
            {
                "index": i,
                "uuid": f"GPU-{i:04d}",
                "host": "node-a",
                "model": "NVIDIA H100 80GB HBM3",
                "total_mib": 81559,
                "used_mib": 0 if i else 20480,
                "util": 0 if i else 87,
            }
            for i in range(2)
        ]
    )
    url, process = start_prometheus(tmp_path / "prom", {"dcgm": [exporter.target]})
    try:
        assert wait_for_series(url, "DCGM_FI_DEV_FB_USED"), "Prometheus never scraped the DCGM exporter"
        config = tiny_config(tmp_path / "drape", queue={"fleet": "prometheus", "prometheus_url": url})
        store = JobStore(config.queue_url)
        view = fleet_view(config, store)
        assert view.source == "prometheus" and {g.uuid for g in view.gpus} == {"GPU-0000", "GPU-0001"}
        busy = next(g for g in view.gpus if g.uuid == "GPU-0000")
        assert busy.observed_used_gib == pytest.approx(20.0) and busy.total_gib == pytest.approx(81559 / 1024)
        assert busy.observed_util == 87 and busy.node == "node-a"
    finally:
        process.terminate()
        process.wait(timeout=10)
        exporter.close()
    down = fleet_view(config, store)  # Prometheus gone: the ledger's inventory, said out loud
    assert down.source == "ledger" and "unavailable" in down.note and {g.uuid for g in down.gpus} == {"GPU-0000", "GPU-0001"}


def test_kubernetes_objects_validate_against_the_api_schema():
    import kubernetes_validate
    from kubernetes import client

    from drape.config import KubernetesLauncherConfig
    from scheduler.engines.kubernetes.objects import build_job, headless_service
    from scheduler.policy import GpuState

    settings = KubernetesLauncherConfig(node_label=None)  # pinned to nodes below (`hosts`)
    job = {
        "id": "stage-training-abc123",
        "kind": "stage-training",
        "stage": "geometry",
        "env": json.dumps({"DRAPE_RUN": "r1"}),
        "command": json.dumps([sys.executable, "-m", "drape.train", "--config", "/etc/drape/h100.yaml", "--stage", "geometry"]),
        "labels": json.dumps(
            {
                "launch": "torchrun",
                "mounts": json.dumps(["/mnt/drape", "/mnt/nvme/drape-shards"]),
                "models": json.dumps(["/models/sd3/vae"]),
            }
        ),
        "attempts": 2,
    }
    one_node = [GpuState(f"h100-00/gpu{i}", "h100-00", "H100-80GB", 80) for i in range(8)]
    two_nodes = one_node + [GpuState(f"h100-01/gpu{i}", "h100-01", "H100-80GB", 80) for i in range(8)]
    api = client.ApiClient()
    single, indexed = build_job(job, one_node, settings), build_job(job, two_nodes, settings)
    for obj in (single, indexed, headless_service(indexed.metadata.name, settings.namespace, indexed.metadata.labels)):
        kubernetes_validate.validate(api.sanitize_for_serialization(obj), "1.33", strict=True)
    pod = single.spec.template.spec
    assert pod.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod.containers[0].resources.limits["nvidia.com/gpu"] == "8"  # host shares: tests/unit/test_k8s_pods.py
    assert single.metadata.name == "drape-stage-training-abc123-a2"  # each attempt its own Job: no 409 on a retry
    assert pod.containers[0].command[:3] == ["torchrun", "--nnodes=1", "--nproc-per-node=8"]
    assert pod.containers[0].command[-6:-4] == ["-m", "drape.train"]
    # the paths the job's config uses, mounted at the same paths (checkpoints never on the container's disk)
    mounted = {m.mount_path: m.name for m in pod.containers[0].volume_mounts}
    volumes = {v.name: v for v in pod.volumes}
    assert set(mounted) == {"/dev/shm", "/mnt/drape", "/mnt/nvme/drape-shards", "/models/sd3/vae"}
    assert volumes[mounted["/mnt/drape"]].host_path.path == "/mnt/drape"
    vae = next(m for m in pod.containers[0].volume_mounts if m.mount_path == "/models/sd3/vae")
    assert vae.read_only and volumes[vae.name].host_path.type == "Directory"  # pretrained weights: read, never written
    claimed = build_job(job, one_node, settings.model_copy(update={"volume_claims": {"/mnt/drape": "drape-live"}}))
    claimed_volumes = {v.name: v for v in claimed.spec.template.spec.volumes}
    assert claimed_volumes[mounted["/mnt/drape"]].persistent_volume_claim.claim_name == "drape-live"
    kubernetes_validate.validate(api.sanitize_for_serialization(claimed), "1.33", strict=True)
    with pytest.raises(ValueError, match="path 'relative/root' of its config is relative"):
        build_job({**job, "labels": json.dumps({"mounts": json.dumps(["relative/root"])})}, one_node, settings)
    assert (
        single.metadata.labels["drape.ai/stage"] == "geometry"
        and single.metadata.labels["drape.ai/job-id"] == "stage-training-abc123"
    )
    assert indexed.spec.completion_mode == "Indexed" and indexed.spec.completions == 2
    script = indexed.spec.template.spec.containers[0].command[2]
    assert "--nnodes=2" in script and "JOB_COMPLETION_INDEX" in script and "-m drape.train" in script
    operator = build_job(job, two_nodes, settings.model_copy(update={"training_operator": True}))
    assert operator["kind"] == "PyTorchJob" and operator["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    template = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "x"},
        "spec": operator["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"],
    }
    kubernetes_validate.validate(template, "1.33", strict=True)
    assert pod.affinity is None  # any model: the node selector pins the placed one
    settings = settings.model_copy(update={"products": {**settings.products, "L40S-48GB": "NVIDIA-L40S"}})
    pinned = build_job({**job, "labels": json.dumps({"gpu_models": "H100|A100"})}, one_node, settings)
    kubernetes_validate.validate(api.sanitize_for_serialization(pinned), "1.33", strict=True)
    (term,) = (
        pinned.spec.template.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    )
    (requirement,) = term.match_expressions
    assert requirement.key == "nvidia.com/gpu.product" and requirement.operator == "In"
    assert "NVIDIA-H100-80GB-HBM3" in requirement.values and "NVIDIA-L40S" not in requirement.values
    # shared GPUs: on a node declared to share (MPS), a shareable single-GPU job requests the shared resource,
    # its declared share as MPS's thread percentage; a job planned to run alone is refused there (it would
    # share, or never schedule), and runs on whole GPUs where nothing is shared
    from scheduler.engines.kubernetes.devices import BindingError

    shared = settings.model_copy(update={"sharing": "mps"})
    service, one_gpu = {**job, "labels": json.dumps({"share": "0.5"})}, one_node[:1]
    served = build_job(service, one_gpu, shared)
    kubernetes_validate.validate(api.sanitize_for_serialization(served), "1.33", strict=True)
    container = served.spec.template.spec.containers[0]
    assert container.resources.limits["nvidia.com/gpu.shared"] == container.resources.requests["nvidia.com/gpu.shared"] == "1"
    assert "nvidia.com/gpu" not in container.resources.limits
    assert {e.name: e.value for e in container.env}["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    with pytest.raises(BindingError, match="planned to run alone on 1 GPU"):
        build_job({**job, "labels": json.dumps({"exclusive": "true", "share": "0.5"})}, one_gpu, shared)
    with pytest.raises(BindingError, match="planned to run alone on 8 GPU"):
        build_job(job, one_node, shared)
    assert build_job(job, one_node, settings).spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "8"
    assert build_job(service, one_gpu, settings).spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    # pinned to the queue's nodes: one node's pod to it; across nodes, one pod on each of them
    hosts = settings.model_copy(update={"node_label": "kubernetes.io/hostname"})
    on_node, across = build_job(job, one_node, hosts), build_job(job, two_nodes, hosts)
    operated = build_job(job, two_nodes, hosts.model_copy(update={"training_operator": True}))
    operated_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}
    operated_pod["spec"] = operated["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    for obj in (api.sanitize_for_serialization(on_node), api.sanitize_for_serialization(across), operated_pod):
        kubernetes_validate.validate(obj, "1.33", strict=True)

    def placement(obj) -> tuple[list[list[str]], list[str]]:
        affinity = obj.spec.template.spec.affinity
        (term,) = affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
        apart = (
            affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution if affinity.pod_anti_affinity else []
        )
        return [[r.key, *r.values] for r in term.match_expressions], [a.topology_key for a in apart]

    assert placement(on_node) == ([["kubernetes.io/hostname", "h100-00"]], [])
    assert placement(across) == ([["kubernetes.io/hostname", "h100-00", "h100-01"]], ["kubernetes.io/hostname"])
    both = placement(build_job({**job, "labels": json.dumps({"gpu_models": "H100"})}, one_node, hosts))[0]
    assert both == [["nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"], ["kubernetes.io/hostname", "h100-00"]]
    assert operated["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    broken = api.sanitize_for_serialization(single)
    broken["spec"]["template"]["spec"]["containers"][0]["resources"]["limitz"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.33", strict=True)


def test_the_kubernetes_launcher_builds_its_clients_after_loading_the_kube_config(tmp_path, monkeypatch):
    """Every API client targets the cluster of the kube config (none is built before it is loaded,
    which made the first one target localhost), and every call carries the request timeout."""
    from drape.config import KubernetesLauncherConfig
    from scheduler.engines.kubernetes.launcher import KubernetesLauncher
    from scheduler.engines.kubernetes.objects import pytorchjob_outcome

    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://k8s.example:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    launcher = KubernetesLauncher(KubernetesLauncherConfig(request_timeout_seconds=7))
    clients = launcher._api()
    assert {name: c.api_client.configuration.host for name, c in clients.items()} == {
        name: "https://k8s.example:6443" for name in ("batch", "core", "custom")
    }
    seen = {}
    monkeypatch.setattr(clients["batch"], "read_namespaced_job_status", lambda *a, **k: seen.update(k) or None)
    launcher._read("job:drape-x-a1")
    assert seen == {"_request_timeout": 7}
    done = {"metadata": {"name": "p"}, "status": {"conditions": [{"type": "Running", "status": "False"}]}}
    assert pytorchjob_outcome(done) is None
    done["status"]["conditions"].append({"type": "Failed", "status": "True", "message": "rank 3 OOM"})
    assert pytorchjob_outcome(done).exit_code == 1 and "rank 3 OOM" in pytorchjob_outcome(done).message


def test_a_cycle_that_fails_is_logged_and_the_dispatcher_goes_on(tmp_path, capsys):
    from drape.ops import metrics
    from scheduler.dispatch.dispatcher import Dispatcher

    config, _ = _config_file(tmp_path)
    dispatcher = Dispatcher(config, JobStore(config.queue_url))
    real_cycle, calls, reports = dispatcher.cycle, [], []

    def flaky(now=None):
        calls.append(now)
        if len(calls) == 1:
            raise ConnectionError("the queue database went away for a moment")
        return real_cycle(now)

    dispatcher.cycle = flaky  # type: ignore[method-assign]
    before = metrics.DISPATCH_ERRORS._value.get()
    dispatcher.run(max_cycles=2, on_cycle=reports.append)
    assert len(calls) == 3 and len(reports) == 2  # the failed cycle did not count, nor end the loop
    assert metrics.DISPATCH_ERRORS._value.get() == before + 1
    assert "cycle failed (1 in a row): ConnectionError: the queue database went away" in capsys.readouterr().out


def test_a_job_runs_only_on_the_gpu_models_it_allows_and_one_no_gpu_can_hold_fails(tmp_path):
    """`JobSpec.gpu_models` end to end: stored with the job, read back by the dispatcher's policy; a
    small job that would best-fit an L40S goes to an H100 when it allows H100s only, and a job
    allowing a model the fleet lacks fails with a message naming its models."""
    from scheduler.dispatch.dispatcher import Dispatcher
    from scheduler.engines.local.launcher import NullLauncher  # the test reads where the jobs were placed

    config, _ = _config_file(tmp_path)
    store = JobStore(config.queue_url)
    pinned = store.submit(JobSpec(kind="gate-eval", mem_gib=10, duration_s=60, command=["true"], gpu_models=["H100"]))
    free = store.submit(JobSpec(kind="gate-eval", mem_gib=10, duration_s=60, command=["true"]))
    absent = store.submit(JobSpec(kind="gate-eval", mem_gib=10, duration_s=60, command=["true"], gpu_models=["A100"]))
    assert {j.id: j.models for j in store.pending()}[pinned] == ("H100",)
    Dispatcher(config, store, launcher=NullLauncher()).cycle()
    assert json.loads(store.get(pinned)["assigned"])[0].startswith("h100")
    assert json.loads(store.get(free)["assigned"])[0].startswith("l40s")  # the smallest model that fits
    failed = store.get(absent)
    assert failed["state"] == "failed" and "models it allows (A100)" in failed["message"]
    with pytest.raises(Exception, match="gpu_models must be non-empty names"):
        JobSpec(kind="gate-eval", mem_gib=10, duration_s=60, command=["true"], gpu_models=["H100|A100"])


def test_the_cycle_exports_the_series_of_running_jobs_only(tmp_path):
    """The join series (job, run, GPU) of a job that ended goes at the next cycle, one that runs keeps
    its GiB, a job that comes back has its series again; the cycle histogram counts each cycle."""
    from drape.ops.metrics import REGISTRY
    from scheduler.dispatch.dispatcher import Dispatcher
    from scheduler.engines.local.launcher import NullLauncher

    def held() -> dict[str, float]:
        return {
            sample.labels["job_id"]: sample.value
            for metric in REGISTRY.collect()
            if metric.name == "drape_queue_job_gpu_memory_gib"
            for sample in metric.samples
            if sample.labels["run"] == "series"
        }

    def cycles() -> float:
        return REGISTRY.get_sample_value("drape_queue_dispatch_cycle_seconds_count") or 0.0

    config, _ = _config_file(tmp_path)
    store = JobStore(config.queue_url)
    spec = {"kind": "gate-eval", "duration_s": 60, "command": ["true"], "labels": {"run": "series"}}
    first, second = store.submit(JobSpec(mem_gib=30, **spec)), store.submit(JobSpec(mem_gib=20, **spec))
    dispatcher, before = Dispatcher(config, store, launcher=NullLauncher()), cycles()
    dispatcher.cycle()
    assert held() == {first: 30.0, second: 20.0}
    store.finish(first, exit_code=0, dispatcher=dispatcher.id)
    dispatcher.mine.pop(first)
    dispatcher.cycle()
    assert held() == {second: 20.0}
    store.finish(second, exit_code=1, dispatcher=dispatcher.id, max_attempts=2)  # back to the queue
    dispatcher.mine.pop(second)
    report = dispatcher.cycle()
    assert report.started == [second] and held() == {second: 20.0}
    assert cycles() - before == 3


def test_a_starving_stage_job_preempts_a_service_that_restarts_at_once_elsewhere(tmp_path):
    """Preemption end to end with real processes: two H100 nodes each hold one H100-only service, so
    a 4-GPU stage job that has waited an hour fits neither. The dispatcher preempts one service
    (stops its process, requeues it without spending an attempt, counts the preemption), starts the
    stage job on that node, and the service starts again on the other node's idle GPUs."""
    from scheduler.dispatch.dispatcher import Dispatcher

    config, _ = _config_file(tmp_path)
    store = JobStore(config.queue_url)
    dispatcher = Dispatcher(config, store)
    starts = tmp_path / "starts"
    starts.mkdir()
    record = f'echo "$CUDA_VISIBLE_DEVICES" >> {starts}/"$DRAPE_JOB_ID"; exec sleep 120'
    services = [
        store.submit(
            JobSpec(kind="inference-benchmark", mem_gib=30, duration_s=3600, gpu_models=["H100"], command=["sh", "-c", record])
        )
        for _ in range(5)
    ]
    dispatcher.cycle()
    node = {job: json.loads(store.get(job)["assigned"])[0].split("/")[0] for job in services}
    packed = max(set(node.values()), key=list(node.values()).count)
    assert list(node.values()).count(packed) == 4  # fullest node first: four on one node, the fifth on the other
    for job in [job for job in services if node[job] == packed][:3]:
        store.cancel(job)
    dispatcher.cycle()
    survivors = [job for job in services if store.get(job)["state"] == "running"]
    handles = {job: store.get(job)["handle"] for job in survivors}
    stage = store.submit(
        JobSpec(kind="stage-training", gpus=4, mem_gib=70, duration_s=600, priority=5, command=["sh", "-c", "exec sleep 120"]),
        now=time.time() - 3600,
    )
    try:
        report = dispatcher.cycle()
        assert stage in report.started and len(report.preempted) == 1, report
        (victim,) = report.preempted
        row = store.get(victim)
        assert row["state"] == "queued" and f"preempted for {stage}" in row["message"] and row["attempts"] == 0
        assert json.loads(row["labels"])["preempted"] == "1"
        pid = int(handles[victim].split(":")[1])
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()
        stage_node = json.loads(store.get(stage)["assigned"])[0].split("/")[0]
        assert node[victim] == stage_node
        again = dispatcher.cycle()
        assert victim in again.started
        assert json.loads(store.get(victim)["assigned"])[0].split("/")[0] not in (stage_node, "l40s-00")
        deadline = time.monotonic() + 20
        while len((starts / victim).read_text().split()) < 2:
            assert time.monotonic() < deadline, "the preempted service never started again"
            time.sleep(0.05)
        stage_gpus = json.loads(store.get(stage)["assigned"])
        assert all(store.ledger()[gpu][1] == 1 for gpu in stage_gpus)  # the stage job alone on its GPUs
    finally:
        for job in [*survivors, stage]:
            store.cancel(job)
        dispatcher.cycle()


def test_a_job_crowded_onto_a_shared_gpu_moves_to_a_gpu_that_frees_up(tmp_path):
    """Spreading end to end: with every GPU taken, two more jobs share GPUs (the fallback); when a
    GPU frees up and nothing waits, the dispatcher moves one of them there: preempted (its message
    says why), claimed again on the idle GPU, and no GPU ever holds more than the ledger allows."""
    from scheduler.dispatch.dispatcher import Dispatcher
    from scheduler.engines.local.launcher import NullLauncher  # the test reads where the jobs were placed

    config, _ = _config_file(tmp_path)
    store = JobStore(config.queue_url)
    dispatcher = Dispatcher(config, store, launcher=NullLauncher())
    solo = [store.submit(JobSpec(kind="gate-eval", mem_gib=20, duration_s=7200, command=["true"])) for _ in range(12)]
    dispatcher.cycle()
    crowded = [store.submit(JobSpec(kind="gate-eval", mem_gib=20, duration_s=7200, command=["true"])) for _ in range(2)]
    report = dispatcher.cycle()
    assert sorted(report.started) == sorted(crowded) and not report.preempted
    shared = {json.loads(store.get(job)["assigned"])[0] for job in crowded}
    assert all(store.ledger()[gpu][1] == 2 for gpu in shared)
    alone = next(job for job in solo if json.loads(store.get(job)["assigned"])[0] not in shared)
    freed = json.loads(store.get(alone)["assigned"])[0]
    store.cancel(alone)
    report = dispatcher.cycle()
    (moved,) = report.preempted
    assert moved in crowded and report.started == [moved]
    row = store.get(moved)
    assert json.loads(row["assigned"]) == [freed] and json.loads(row["labels"])["preempted"] == "1"
    assert "moved off a crowded GPU" in row["message"]
    assert [e["event"] for e in store.allocation_events([moved])] == ["claim", "release", "claim"]
    assert max(jobs for _, jobs in store.ledger().values()) == 2 and store.ledger()[freed] == (20.0, 1)
