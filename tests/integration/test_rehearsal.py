"""The rehearsal (`make rehearse`): configs/rehearsal.yaml's production path end to end, on
separate nodes, with kills.

Real services: S3 through a moto server over HTTP, the queue on a throwaway PostgreSQL with a
dispatcher process of its own, an `mlflow server`, the Pushgateway, a Prefect server and process
worker running `prefect deployment run 'staged-training/rehearsal'`. Every stage job is 2 FSDP
ranks under torchrun (gloo), with sharded intermediate checkpoints saved in the background.

Three nodes share no disk (tests/integration/nodes.py: a mount namespace each, its own directory
bound over drape's live root and shard cache): `flow` (no GPU slots) runs the Prefect worker and
its flow runs; `node-a-00` and `node-b-00` (2 slots each) run the stage jobs, started in them by
the dispatcher (a CPU process of its own, touching no live root) through `queue.node_commands`.
They share the object store, the queue database, MLflow and Prefect's API: every hand-off goes
through the store.

1. An uninterrupted run: four stages pass, each trained by 2 ranks; the server holds the flow
   run's train, gate, snapshot and archive task runs and a gate-report artifact per stage; the DCP
   checkpoints are archived and verified; each node's disk holds what the invariant allows and
   nothing reached the host's; each stage after the first trained on the node whose cache the
   stage before warmed, and waited on data less than 1% of its time there.
2. A second run loses, during stage 2, the node training it (all its processes, its disk) and its
   flow process: the node leaves the fleet, the queue retries the job on the other node, which
   resumes from the store's newest sharded checkpoint; the run resumed with `--param
   resume=<run id>` does not train stage 1 again.
3. In the same resumed run, one rank of stage 3's job is SIGKILLed: torchrun fails the job, the
   queue retries it, the retry resumes from the newest sharded checkpoint.
4. Still in that run, the dispatcher is SIGKILLed during stage 4's job and started again: the new
   one adopts the running job (one claim in the allocation log), which finishes.
The resumed run ends with the weights of the uninterrupted one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
import torch
import yaml

from drape import STAGES
from drape.config import deep_merge, load_config
from drape.layout import checkpoint_step, live_root
from drape.storage.handoff import newest_published, result_key
from drape.storage.retention import read_archive_manifest, verify_archived
from drape.storage.store import open_store
from drape.training.checkpoints.checkpoint import load_model
from scheduler.queue.store import JobStore
from tests.conftest import prefect_api
from tests.integration.nodes import Nodes

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TRAINERS = ("node-a-00", "node-b-00")


def _fleet(path: Path, nodes: tuple[str, ...]) -> None:
    """The queue's static fleet: 2 CPU slots on each of `nodes` (a node lost leaves it)."""
    groups = [{"model": "cpu", "memory_gib": 16, "nodes": 1, "gpus_per_node": 2, "node_prefix": n[:-3]} for n in nodes]
    path.write_text(yaml.safe_dump({"groups": groups}))


def _until(predicate, timeout: float, what: str, every: float = 0.2, flow: subprocess.Popen | None = None):
    """`predicate`'s first true value, polled every `every` s; fails after `timeout` s, or at once
    when `flow` (the watcher of the flow run that should make it happen) has ended."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if flow is not None and flow.poll() is not None:
            pytest.fail(f"rehearsal: the flow run ended before {what}:\n{flow.communicate()[0][-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"rehearsal: {what} did not happen within {timeout:.0f} s")
        time.sleep(every)


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _pids(**env: str | set[str]) -> list[int]:
    """Processes whose environment holds every `env` item: the value, or one of a set of them.
    Never "the name is set" alone: the other worker's tests run queue jobs and flow runs too."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            environ = _environ(int(entry.name))
            if all(environ.get(name) in ({value} if isinstance(value, str) else value) for name, value in env.items()):
                found.append(int(entry.name))
    return found


def _kill(pids: list[int]) -> list[int]:
    """SIGKILL each of `pids`; returns those that were still there."""
    killed = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


class Rehearsal:
    def __init__(self, root: Path, config_path: Path, stack, env: dict[str, str], nodes: Nodes):
        self.root, self.config_path, self.stack, self.env, self.nodes = root, config_path, stack, env, nodes
        self.config = load_config(config_path)
        self.store = JobStore(self.config.queue_url)
        self.objects = open_store(self.config)
        self.dispatcher: subprocess.Popen | None = None
        self.dispatchers = 0

    def start_dispatcher(self) -> None:
        self.dispatchers += 1
        log = open(self.root / f"dispatcher-{self.dispatchers}.log", "ab")
        self.dispatcher = subprocess.Popen(  # a CPU process of its own: its launches enter the trainer nodes
            [str(Path(sys.executable).with_name("drape")), "queue", "dispatch", "--config", str(self.config_path)],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def deployment_run(self, *params: str) -> subprocess.Popen:
        from drape.cli.stack import _prefect

        args = ["deployment", "run", "staged-training/rehearsal", "--param", f"config_path={self.config_path}"]
        for param in params:
            args += ["--param", param]
        return subprocess.Popen(
            [_prefect(), *args, "--watch", "--watch-timeout", "900"],
            cwd=REPO,
            env=self.stack.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def jobs(self, run_id: str, stage: str | None = None) -> list[dict]:
        return [
            job
            for job in self.store.jobs()
            if json.loads(job["labels"] or "{}").get("run") == run_id and (stage is None or job["stage"] == stage)
        ]

    def running_job(self, run_id: str, stage: str) -> dict | None:
        return next((j for j in self.jobs(run_id, stage) if j["state"] == "running" and j["handle"]), None)

    def checkpoint(self, run_id: str, stage: str, step: int) -> bool:
        """Whether the stage's trainer published a checkpoint of `step` or later to the store."""
        newest = newest_published(self.objects, run_id, stage)
        return newest is not None and checkpoint_step(newest) >= step

    def live(self, node: str) -> Path:
        """`node`'s own live root, seen from the host."""
        return self.nodes.disk(node) / "0"

    def node_of(self, job: dict) -> str:
        nodes = {gpu.split("/")[0] for gpu in json.loads(job["assigned"] or "[]")}
        assert len(nodes) == 1, job
        return nodes.pop()

    def result(self, run_id: str, stage: str) -> dict:
        """What the stage's trainer published (the last attempt's)."""
        return json.loads(self.objects.read_bytes(result_key(run_id, stage)))

    def results(self, job: dict) -> list[dict]:
        """The result line of every attempt of `job` that finished training (from its log)."""
        log = live_root(self.config).parent / "queue" / "logs" / f"{job['id']}.log"
        lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
        return [json.loads(line) for line in lines if line.startswith('{"stage"')]

    def final_weights(self) -> dict[str, torch.Tensor]:
        return load_model(self.live("flow") / "baselines" / "denoise" / "checkpoint").state_dict()


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory, moto_server, postgres_url, mlflow_server, pushgateway):
    import boto3
    import sqlalchemy

    from drape.cli.stack import PREFECT_FILE, Stack, free_port

    root = tmp_path_factory.mktemp("rehearsal")
    fleet = root / "fleet.yaml"
    _fleet(fleet, TRAINERS)
    database = f"rehearsal_{uuid.uuid4().hex[:8]}"
    with sqlalchemy.create_engine(postgres_url, isolation_level="AUTOCOMMIT").connect() as connection:
        connection.execute(sqlalchemy.text(f"CREATE DATABASE {database}"))
    bucket = f"drape-rehearsal-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(Bucket=bucket)
    services = {
        "paths": {"root": str(root / "drape")},
        "storage": {"object_store_url": f"s3://{bucket}", "endpoint_url": moto_server},
        "tracking": {"uri": mlflow_server},
        "metrics": {"pushgateway_url": pushgateway},
        "queue": {
            "url": postgres_url.rsplit("/", 1)[0] + f"/{database}",
            "inventory": str(fleet),
        },
    }
    nodes = Nodes(root, [root / "drape" / "live"])  # the live root holds the shard cache
    for node in ("flow", *TRAINERS):
        nodes.add(node)
    services["queue"]["node_commands"] = {node: nodes.command(node) for node in TRAINERS}
    config_path = root / "rehearsal.yaml"
    config_path.write_text(
        yaml.safe_dump(deep_merge(yaml.safe_load((REPO / "configs" / "rehearsal.yaml").read_text()), services))
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_WORKER_QUERY_SECONDS": "2", "OMP_NUM_THREADS": "1"}
    saved = os.environ.get("PREFECT_WORKER_QUERY_SECONDS")
    os.environ["PREFECT_WORKER_QUERY_SECONDS"] = "2"  # the worker picks a flow run up within 2 s
    stack = Stack(root / "prefect", free_port())
    rehearsal = Rehearsal(root, config_path, stack, env, nodes)
    try:
        stack.start_server()
        # the one pool and deployment it runs (test_deployments.py deploys them all): each `prefect`
        # command is an interpreter start, and `deploy --all` loads every flow's entry point
        stack.prefect("work-pool", "create", "local", "--type", "process", "--overwrite")
        stack.prefect("deploy", "--name", "staged-training/rehearsal", "--prefect-file", str(PREFECT_FILE))
        stack.start_worker("local", prefix=nodes.command("flow"))  # its flow runs: on the flow's node
        rehearsal.start_dispatcher()
        yield rehearsal
    finally:
        if rehearsal.dispatcher is not None:
            os.killpg(rehearsal.dispatcher.pid, signal.SIGKILL)
        stack.stop(grace=5)  # a throwaway server and worker: their graceful stop held teardown 20 s
        # nothing a job started outlives the rehearsal (its jobs: not another test's)
        _kill(_pids(DRAPE_JOB_ID={job["id"] for job in rehearsal.store.jobs()}))
        nodes.close()
        if saved is None:
            os.environ.pop("PREFECT_WORKER_QUERY_SECONDS", None)
        else:
            os.environ["PREFECT_WORKER_QUERY_SECONDS"] = saved


def _finish(process: subprocess.Popen, what: str, timeout: float = 900) -> str:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"{what} did not finish:\n{output[-3000:]}")
    assert process.returncode == 0, f"{what} failed:\n{output[-4000:]}"
    return output


def _data_wait(result: dict) -> dict[str, float]:
    """The parts of a stage job's training time (rank 0) spent waiting on data: on reads of shards
    that were not in the node's cache yet (the store), and on the loader's decoding (CPU: on 2
    cores shared by 2 ranks, their decoding processes and the background uploads)."""
    seconds = result["train_seconds"]
    return {"store reads": result["shard_read_wait_seconds"] / seconds, "loader": result["data_wait_seconds"] / seconds}


def _run_ids(rehearsal: Rehearsal) -> list[str]:
    return sorted(
        {json.loads(job["labels"] or "{}").get("run") for job in rehearsal.store.jobs() if job["kind"] == "stage-training"}
    )


def _alternating(events: list[dict]) -> dict[str, int]:
    """Claims per job, checking no job is ever claimed twice without a release between (one copy at a time)."""
    held, claims = defaultdict(int), defaultdict(int)
    for event in events:
        key = (event["job_id"], event["gpu_uuid"])
        held[key] += 1 if event["event"] == "claim" else -1
        assert held[key] in (0, 1), f"job {event['job_id']} claimed {event['gpu_uuid']} twice at once"
        claims[event["job_id"]] += event["event"] == "claim"
    return claims


def test_the_production_path_survives_kills_and_resumes_to_the_same_weights(rehearsal):
    timings = {}
    # 1. uninterrupted -----------------------------------------------------------------------
    started = time.monotonic()
    output = _finish(rehearsal.deployment_run("run_name=rehearsal-1"), "run 1")
    timings["run 1"] = time.monotonic() - started
    assert "Completed" in output
    (flow_run,) = prefect_api(rehearsal.stack.api_url, "/flow_runs/filter", {"flow_runs": {"name": {"any_": ["rehearsal-1"]}}})
    assert flow_run["state"]["type"] == "COMPLETED"
    tasks = prefect_api(rehearsal.stack.api_url, "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run["id"]]}}})
    assert {f"{step}-{stage}" for step in ("train", "gate", "snapshot", "archive") for stage in STAGES} <= {
        t["name"] for t in tasks
    }
    artifacts = prefect_api(
        rehearsal.stack.api_url, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run["id"]]}}}
    )
    assert {f"gate-report-{stage}" for stage in STAGES} <= {a["key"] for a in artifacts}
    assert all("Gate `" in a["data"] for a in artifacts if (a["key"] or "").startswith("gate-report-"))
    (first,) = _run_ids(rehearsal)
    reference = rehearsal.final_weights()
    for stage in STAGES:
        (job,) = rehearsal.jobs(first, stage)
        (result,) = rehearsal.results(job)
        assert job["state"] == "succeeded" and job["gpus"] == 2 and result["world_size"] == 2, job
        assert len(json.loads(job["assigned"])) == 2 and len(result["ranks"]) == 2
    store = open_store(rehearsal.config)
    archived = [r for r in read_archive_manifest(store) if r["run_id"] == first]
    assert {r["stage"] for r in archived if ".dcp/" in r["key"]} == set(STAGES)  # sharded intermediates archived
    assert {r["outcome"] for r in archived if ".dcp/" in r["key"]} == {"passed"}  # published, then adopted
    verify_archived(store, archived)
    for node in ("flow", *TRAINERS):  # the run's live files went once archived; baselines and shards stay
        runs = rehearsal.live(node) / "runs"
        leftovers = [p for p in runs.rglob("*") if p.is_file()] if runs.exists() else []
        assert not leftovers, (node, leftovers)
    assert {p.name for p in (rehearsal.live("flow") / "baselines").iterdir()} == set(STAGES)
    assert not any(rehearsal.live(node).joinpath("baselines").exists() for node in TRAINERS)  # the flow's node gates
    host = live_root(rehearsal.config)
    assert not [p for p in host.rglob("*")], "a process wrote to the host's live root, outside every node"
    # each stage after the first trained where the stage before warmed the cache, and read from it
    placed = {stage: rehearsal.node_of(rehearsal.jobs(first, stage)[0]) for stage in STAGES}
    assert len(set(placed.values())) == 1, placed
    waits = {}
    for stage in STAGES:
        result = rehearsal.result(first, stage)
        assert result["node"] == placed[stage]
        waits[stage] = _data_wait(result)
        assert stage == "denoise" or result["warmed"]["done"], result["warmed"]
        if stage != STAGES[0]:  # on the warm node: not one read waited on the store
            assert waits[stage]["store reads"] == 0.0, (stage, waits[stage])

    # 2. the node training stage 2 lost whole, and the flow's process with it ------------------
    started = time.monotonic()
    second_flow = rehearsal.deployment_run("run_name=rehearsal-2")
    second = _until(lambda: next(iter(set(_run_ids(rehearsal)) - {first}), None), 300, "run 2 starting", flow=second_flow)
    job = _until(lambda: rehearsal.running_job(second, "texture"), 300, "stage 2's job running", flow=second_flow)
    _until(
        lambda: rehearsal.checkpoint(second, "texture", 20), 300, "stage 2's first sharded checkpoint published", flow=second_flow
    )
    lost = rehearsal.node_of(job)
    survivor = next(node for node in TRAINERS if node != lost)
    _fleet(Path(rehearsal.config.queue.inventory or ""), (survivor,))  # the node leaves the fleet (DCGM: no series)
    flow_pids = [pid for pid in rehearsal.nodes.pids("flow") if "PREFECT__FLOW_RUN_ID" in _environ(pid)]
    assert flow_pids and rehearsal.nodes.pids(lost)
    _kill(flow_pids)  # a pid gone meanwhile is no error
    assert rehearsal.nodes.kill(lost)  # every process on it, then its disk
    assert not rehearsal.jobs(second, "geometry")
    # resumed at once: the killed flow's lease is taken over (its holder provably dead), no wait for
    # its watcher, which sees the flow run crash meanwhile
    resumed = rehearsal.deployment_run(f"resume={second}", "run_name=rehearsal-2-resumed")
    try:
        second_flow.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        second_flow.kill()
        second_flow.communicate()

    # 3. one rank of stage 3's job killed ------------------------------------------------------
    geometry = _until(lambda: rehearsal.running_job(second, "geometry"), 600, "stage 3's job running", flow=resumed)
    # rank 1 found while it starts: the kill must land between the first checkpoint and the last
    # step (40 steps, seconds), and a scan of every process's environment takes seconds on a busy machine
    rank_one = _until(lambda: _pids(DRAPE_JOB_ID=geometry["id"], RANK="1"), 60, "stage 3's rank 1", flow=resumed)
    _until(lambda: rehearsal.checkpoint(second, "geometry", 20), 300, "stage 3's first sharded checkpoint", flow=resumed)
    assert _kill(rank_one), "rehearsal: stage 3's rank 1 ended before it could be killed"
    _kill(_pids(DRAPE_JOB_ID=geometry["id"], RANK="1"))  # the decoding worker rank 1 forked, if it outlived it

    # 4. the dispatcher killed during stage 4's job, then started again --------------------------
    denoise = _until(lambda: rehearsal.running_job(second, "denoise"), 600, "stage 4's job running", flow=resumed)
    assert rehearsal.dispatcher is not None
    os.killpg(rehearsal.dispatcher.pid, signal.SIGKILL)
    rehearsal.dispatcher.wait()
    killed_dispatcher = rehearsal.store.get(denoise["id"])["dispatcher"]
    rehearsal.start_dispatcher()
    output = _finish(resumed, "the resumed run 2")
    timings["run 2 (killed, resumed)"] = time.monotonic() - started

    # the resumed run: stage 1 not trained again, every stage's training went on from a checkpoint
    assert len(rehearsal.jobs(second, "identity")) == 1  # only run 2's first flow trained it
    texture_results = [r for j in rehearsal.jobs(second, "texture") for r in rehearsal.results(j)]
    assert texture_results and all(r["resumed_from_step"] >= 20 for r in texture_results), texture_results
    assert {r["node"] for r in texture_results} == {survivor}  # resumed elsewhere, from the store
    (geometry_job,) = rehearsal.jobs(second, "geometry")
    assert geometry_job["state"] == "succeeded" and geometry_job["attempts"] == 2, geometry_job
    assert [r["resumed_from_step"] >= 20 for r in rehearsal.results(geometry_job)] == [True]
    (denoise_job,) = rehearsal.jobs(second, "denoise")
    assert denoise_job["state"] == "succeeded" and denoise_job["attempts"] == 1, denoise_job
    assert denoise_job["dispatcher"] != killed_dispatcher  # adopted by the restarted dispatcher
    claims = _alternating(rehearsal.store.allocation_events())
    assert claims[denoise_job["id"]] == 2 and claims[geometry_job["id"]] == 2 * 2  # 2 slots per claim
    promoted = json.loads((rehearsal.live("flow") / "baselines" / "denoise" / "baseline.json").read_text())
    assert promoted["run_id"] == second  # the weights compared are the resumed run's own
    worst = max(float((reference[name] - tensor).abs().max()) for name, tensor in rehearsal.final_weights().items())
    assert worst < 1e-5, f"the resumed run's weights differ from the uninterrupted run's by {worst}"
    cold = {s: rehearsal.result(second, s) for s in ("texture", "geometry")}
    waits.update({f"{s} (run 2, {r['node']})": _data_wait(r) for s, r in cold.items()})
    print(f"\nrehearsal: {timings}; largest weight difference {worst:.3g}; claims per job {dict(claims)}")
    print(f"rehearsal: placed {placed}; data-wait fraction {waits}")
