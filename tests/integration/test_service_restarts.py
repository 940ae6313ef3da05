"""Services killed and started again mid-run (issue 68): the Pushgateway, the MLflow server and the
queue's PostgreSQL, each this module's own (the session's shared ones stay up for the other tests),
restarted on the same port with what it had persisted. For each, what drape was doing goes through
once the service is back: nothing lost, nothing done twice, and the operator sees the outage (a
warning naming the service and its URL, another when it answers again, drape_service_outages_total).
The object store's restarts are in test_restarts.py; Prefect's client budget in test_prefect_budget.py.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from drape.ops import metrics
from tests.conftest import _free_port, _start_service, _stop, tiny_config, wait_until


def _outages(service: str) -> float:
    return metrics.SERVICE_OUTAGES.labels(service=service, outcome="recovered")._value.get()


def _in_background(action) -> threading.Thread:
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


def _said(logger: logging.Logger, words: str) -> threading.Event:
    """An event set once `logger` logs a line holding `words`."""
    event = threading.Event()

    class Heard(logging.Handler):
        def emit(self, record):
            if words in record.getMessage():
                event.set()

    logger.addHandler(Heard(logging.WARNING))
    return event


# --- the Pushgateway --------------------------------------------------------------------------------
class Pushgateway:
    """A prometheus-pushgateway in memory only, as Debian runs it without a persistence file: a
    restart comes back empty."""

    def __init__(self):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        argv = ["prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{self.port}", "--persistence.file="]
        self.process = _start_service(argv, f"{self.url}/-/ready", "prometheus-pushgateway")

    def stop(self) -> None:
        _stop(self.process)

    def steps(self, run: str) -> dict[str, float]:
        text = urllib.request.urlopen(f"{self.url}/metrics", timeout=5).read().decode()
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
        return {s.labels["stage"]: s.value for s in samples if s.name == "drape_train_steps" and s.labels.get("run") == run}


@pytest.fixture(scope="module")
def gateway():
    gateway = Pushgateway()
    yield gateway
    gateway.stop()


def test_a_pushgateway_restart_loses_no_series(gateway, config, capsys):
    cfg = config.model_copy(update={"metrics": config.metrics.model_copy(update={"pushgateway_url": gateway.url})})
    run, before = "restart-push", _outages("pushgateway")
    metrics.TRAIN_STEPS.labels(run=run, stage="identity").set(10)
    assert metrics.push_metrics(cfg, {"run": run, "stage": "identity"})
    gateway.stop()  # in memory only: what it held is gone
    metrics.TRAIN_STEPS.labels(run=run, stage="texture").set(20)
    assert metrics.push_metrics(cfg, {"run": run, "stage": "texture"}) is False  # held, the stage goes on
    assert metrics.flush_metrics(cfg) is False  # still down: still held
    gateway.start()
    assert gateway.steps(run) == {}  # the restart lost the identity group
    assert metrics.flush_metrics(cfg)  # the run's close
    assert gateway.steps(run) == {"identity": 10.0, "texture": 20.0}
    metrics.TRAIN_STEPS.labels(run=run, stage="geometry").set(30)
    assert metrics.push_metrics(cfg, {"run": run, "stage": "geometry"})
    assert gateway.steps(run) == {"identity": 10.0, "texture": 20.0, "geometry": 30.0}
    said = capsys.readouterr().err
    assert f"metrics push to {gateway.url}" in said and "holding the series" in said
    assert f"the Pushgateway at {gateway.url} answered again after" in said
    assert _outages("pushgateway") == before + 1


# --- the MLflow server ------------------------------------------------------------------------------
class MlflowServer:
    """`mlflow server` (SQLite backend, artifacts served over HTTP) that can be killed and started
    again on the same port with the same database and artifacts."""

    def __init__(self, root: Path):
        self.root, self.port = root, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        mlflow = str(Path(sys.executable).with_name("mlflow"))
        argv = [mlflow, "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        argv += ["--backend-store-uri", f"sqlite:///{self.root}/mlflow.db", "--artifacts-destination", str(self.root / "art")]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.root / "server.log", "ab") as log:
            self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True)
        wait_until(self._healthy, 90, f"mlflow server on {self.url}", every=0.3)

    def _healthy(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
        try:
            return urllib.request.urlopen(f"{self.url}/health", timeout=2).status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server and its workers: a crash, nothing flushed."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def mlflow_server_restartable(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-restart"))
    yield server
    server.kill()


def test_an_mlflow_restart_mid_snapshot_is_waited_out_and_nothing_is_lost_or_doubled(
    mlflow_server_restartable, tmp_path, caplog, monkeypatch
):
    from drape.ops.tracking import Tracker

    server = mlflow_server_restartable
    # MLflow's own retries without backoff (urllib3's factor 2 waited 0 s, then 4 s and jitter before
    # drape saw the outage): drape's wait, the subject, begins at once
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "0")
    caplog.set_level(logging.WARNING, logger="drape.outage")
    config = tiny_config(tmp_path / "drape", tracking={"uri": server.url, "max_wait_seconds": 60})
    tracker, before = Tracker(config), _outages("mlflow")
    run = tracker.start_run("identity")
    tracker.log_metrics(run, {"identity/loss": 1.0}, 1)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"weights" * 100)
    server.kill()
    # the server comes back once drape has seen it gone: a restart shorter than MLflow's own few quick
    # retries (a quiet machine restarts it in about 5 s) would never reach drape's wait
    seen = _said(logging.getLogger("drape.outage"), "unreachable")
    restart = _in_background(lambda: seen.wait(timeout=60) and server.start())
    # what a stage's snapshot does, the server down when it begins
    tracker.log_metrics(run, {"identity/loss": 0.5}, 2)
    source = tracker.log_artifacts(run, checkpoint, "snapshot/checkpoint")
    version = tracker.register_baseline(run, source, "identity", {"drape.stage": "identity"})
    restart.join(timeout=90)
    assert version == "1" and tracker.aliases() == {"identity-baseline": "1"}
    client = tracker.client
    assert [m.value for m in client.get_metric_history(run, "identity/loss")] == [1.0, 0.5]
    assert len(client.search_runs([tracker.experiment_id])) == 1  # no run made twice
    assert len(client.search_model_versions(f"name='{tracker.model_name}'")) == 1  # no version made twice
    assert [a.path for a in client.list_artifacts(run, "snapshot/checkpoint")] == ["snapshot/checkpoint/model.safetensors"]
    downloaded = tracker.download(source, tmp_path / "back")
    assert (downloaded / "model.safetensors").read_bytes() == b"weights" * 100
    assert f"mlflow at {server.url} unreachable" in caplog.text and "answered again after" in caplog.text
    assert _outages("mlflow") >= before + 1


# --- the queue's PostgreSQL -------------------------------------------------------------------------
class Postgres:
    """A throwaway PostgreSQL (as conftest's `postgres_url`) that can crash and start again on its port."""

    def __init__(self):
        import glob
        import shutil
        import tempfile

        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            pytest.fail("PostgreSQL is not installed; `make services` installs it (apt-get install postgresql)")
        self.bindir, self.port = Path(bins[-1]).parent, _free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="drape-pg-restart-"))  # postgres must reach it
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_postgres:
            shutil.chown(self.directory, "postgres")
        self._run("initdb", "-D", str(self.directory / "data"), "-U", "drape", "--auth=trust")
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "drape", "queue")
        self.url = f"postgresql+psycopg://drape@127.0.0.1:{self.port}/queue"

    def _run(self, program: str, *args: str) -> None:
        subprocess.run([*self.as_postgres, str(self.bindir / program), *args], check=True, capture_output=True, timeout=120)

    def _ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.directory / "data"), *args)

    def start(self) -> None:
        options = f"-h 127.0.0.1 -p {self.port} -k {self.directory}"
        self._ctl("-l", str(self.directory / "log"), "-w", "-o", options, "start")

    def crash(self) -> None:
        """Stop at once, without a checkpoint (the next start recovers from the WAL), every session cut."""
        self._ctl("-m", "immediate", "stop")

    def remove(self) -> None:
        import shutil

        subprocess.run(  # immediate: a throwaway database needs no shutdown checkpoint
            [*self.as_postgres, str(self.bindir / "pg_ctl"), "-D", str(self.directory / "data"), "-m", "immediate", "stop"],
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture(scope="module")
def queue_postgres():
    server = Postgres()
    yield server
    server.remove()


FLEET = {"groups": [{"model": "H100-80GB", "memory_gib": 80, "nodes": 1, "gpus_per_node": 2, "node_prefix": "h100"}]}


def test_a_queue_database_restart_under_waiting_flows_runs_each_job_once(queue_postgres, tmp_path, caplog):
    import yaml

    from scheduler.dispatch.dispatcher import submit_and_wait
    from scheduler.queue.store import JobSpec, JobStore

    caplog.set_level(logging.WARNING, logger="drape.outage")
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(FLEET))
    queue = {"url": queue_postgres.url, "fleet": "static", "inventory": str(tmp_path / "fleet.yaml"), "poll_seconds": 0.1}
    config = tiny_config(tmp_path / "drape", queue={**queue, "max_wait_seconds": 60})
    before, done, markers = _outages("queue_database"), {}, {name: tmp_path / f"{name}.ran" for name in ("first", "second")}

    def flow(name: str) -> None:  # what the train task does: submit its job and wait for it, dispatching
        program = f"import time; open({str(markers[name])!r}, 'a').write('ran\\n'); time.sleep(1.5)"
        spec = JobSpec(kind="gate-eval", command=[sys.executable, "-c", program], mem_gib=30, duration_s=2)
        done[name] = submit_and_wait(config, spec)

    first = _in_background(lambda: flow("first"))
    wait_until(markers["first"].exists, 60, "the first job to start")
    queue_postgres.crash()  # the first job runs on; its flow's next poll meets the outage
    second = _in_background(lambda: flow("second"))  # submitted while the database is down
    said = f"queue_database at postgresql+psycopg://***@127.0.0.1:{queue_postgres.port}/queue unreachable"  # no user
    wait_until(lambda: caplog.text.count(said) >= 2, 30, "both flows to meet the outage")
    queue_postgres.start()
    first.join(timeout=90)
    second.join(timeout=90)
    assert {name: job["state"] for name, job in done.items()} == {"first": "succeeded", "second": "succeeded"}
    assert all(marker.read_text() == "ran\n" for marker in markers.values())  # each ran once
    store = JobStore(config.queue_url)
    assert len(store.jobs()) == 2 and all(job["attempts"] == 1 for job in store.jobs())  # none submitted twice
    events = [(event["job_id"], event["event"]) for event in store.allocation_events()]
    assert sorted(events) == sorted((job["id"], event) for job in done.values() for event in ("claim", "release"))
    assert "answered again after" in caplog.text
    assert _outages("queue_database") >= before + 2


# --- the Prefect server -----------------------------------------------------------------------------
FLOW = """
import sys, time
from pathlib import Path
from prefect import flow, task
from flows.budget import client_budget

marks = Path(sys.argv[1])

@task
def step(number: int) -> int:
    with open(marks / "steps", "a") as steps:
        steps.write(f"{number}\\n")
    while number == 2 and not (marks / "go").exists():  # the test restarts the server meanwhile
        time.sleep(0.1)
    return number

@flow(name="restart-probe")
def probe() -> list[int]:
    return [step(number) for number in range(1, 5)]

with client_budget(float(sys.argv[2])):
    print("steps", probe())
"""


UNUSED_PREFECT_SERVICES = (
    "PREFECT_SERVER_UI_ENABLED",
    *(
        f"PREFECT_SERVER_SERVICES_{name}_ENABLED"
        for name in (
            "CANCELLATION_CLEANUP",
            "FOREMAN",
            "LATE_RUNS",
            "SCHEDULER",
            "PAUSE_EXPIRATIONS",
            "REPOSSESSOR",
            "CLEANUP_RECONCILER",
            "TRIGGERS",
        )
    ),
)


@pytest.mark.slow
def test_a_prefect_server_restart_mid_flow_is_waited_out_and_each_task_runs_once(tmp_path, monkeypatch):
    from drape.cli.stack import Stack, free_port
    from tests.conftest import prefect_api

    for unused in UNUSED_PREFECT_SERVICES:  # a server that starts sooner: what the flow needs only
        monkeypatch.setenv(unused, "false")

    stack, marks = Stack(tmp_path / "prefect", free_port()), tmp_path / "marks"
    marks.mkdir()
    stack.start_server()
    try:
        # orchestration.max_wait_seconds 90: 4 retries, 2 + 4 + 8 + 16 s apart (60 s: 3, 14 s in all)
        run = subprocess.Popen(
            [sys.executable, "-c", FLOW, str(marks), "90"],
            env=stack.env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: "2\n" in _read(marks / "steps"), 120, "the flow's second task to start")
        # the server holds the events it received in memory until its services record them: a crash
        # loses those it had not (the first task's, on a loaded machine), and the flow has no reason to
        # send them again. So the crash comes once the first task is recorded; what the flow sends
        # from then on must reach the restarted server
        wait_until(lambda: _completed_tasks(stack.api_url, 1), 60, "the server to record the first task as completed")
        os.killpg(stack.processes["server"].pid, signal.SIGKILL)  # a crash: the flow's task is mid-run
        stack.processes["server"].wait(timeout=10)
        (marks / "go").touch()  # the task ends while the server is down: its state waits for the server
        stack.start_server()
        said, _ = run.communicate(timeout=120)
        assert run.returncode == 0, said[-3000:]
        assert "steps [1, 2, 3, 4]" in said and _read(marks / "steps") == "1\n2\n3\n4\n"  # each task ran once
        assert f"the Prefect API at {stack.api_url} did not answer" in said  # the operator sees the outage
        flows = prefect_api(stack.api_url, "/flow_runs/filter", {"flow_runs": {"name": {"like_": ""}}})
        assert [flow["state_type"] for flow in flows] == ["COMPLETED"]  # one flow run, completed

        # the server records task runs from the events the flow sent, a little later
        tasks = wait_until(lambda: _completed_tasks(stack.api_url, 4), 60, "the four task runs recorded as completed")
        assert len(tasks) == 4 and all(task["name"].startswith("step-") for task in tasks)  # none ran twice
    finally:
        os.killpg(stack.processes["server"].pid, signal.SIGKILL)


def _completed_tasks(api_url: str, count: int) -> list:
    """The task runs the Prefect server at `api_url` records, once `count` of them are completed; else []."""
    from tests.conftest import prefect_api

    tasks = prefect_api(api_url, "/task_runs/filter", {})
    return tasks if [task["state_type"] for task in tasks].count("COMPLETED") >= count else []


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
