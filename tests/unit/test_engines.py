"""Engines: one shape, one module each, none importing another; the Slurm engine's script, gangs across
whole nodes, sacct's GPU-hours, the config that keeps drape and Slurm counting GPUs alike, and the explicit
environment a local job gets."""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from drape.config import QueueConfig, SlurmLauncherConfig
from drape.training.loop import stop
from scheduler.dispatch.dispatcher import unplaceable
from scheduler.engines import ENGINES, job_environment
from scheduler.engines.slurm.launcher import SlurmError, batch_script, job_name
from scheduler.engines.slurm.sacct import SlurmRun, _gpus_of, _requested_gpus, run_gpu_hours
from scheduler.policy import GpuState, JobRequest, PolicyConfig, plan_drape
from scheduler.policy.baselines import plan_fifo_exclusive
from scheduler.policy.gangs import fits_across_nodes, spanning
from tests.conftest import SENTINEL, TINY, tiny_config

REPO = Path(__file__).resolve().parents[2]
ENGINE_FOLDERS = ("local", "kubernetes", "slurm")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_engine_imports_another():
    """One folder per engine; each engine's modules reach the engines' shared shape, never another engine."""
    assert {module.split(".")[2] for module in ENGINES.values()} == set(ENGINE_FOLDERS)
    engines = REPO / "scheduler" / "engines"
    assert sorted(p.name for p in engines.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(ENGINE_FOLDERS)
    for engine in ENGINE_FOLDERS:
        for path in (engines / engine).rglob("*.py"):
            others = {m for m in _imports(path) for o in ENGINE_FOLDERS if o != engine and m.startswith(f"scheduler.engines.{o}")}
            assert not others, f"{path.relative_to(REPO)} imports another engine: {sorted(others)}"


def test_build_launcher_imports_only_the_engine_the_config_names(tmp_path):
    code = (
        "import sys; from types import SimpleNamespace as N; from scheduler.engines import build_launcher; "
        "c = N(queue=N(launcher='local', job_environment=[], node_commands={})); "
        f"print(type(build_launcher(c, {str(tmp_path / 'logs')!r})).__name__, "
        "sorted(m for m in sys.modules if m in ('scheduler.engines.kubernetes.launcher', 'scheduler.engines.slurm.launcher')))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "LocalLauncher" and done.stdout.strip().endswith("[]"), done.stdout


def _gpus(nodes: int, per_node: int, model: str = "H100-80GB", total: float = 80.0) -> list[GpuState]:
    return [GpuState(f"n{n}/gpu{i}", f"n{n}", model, total) for n in range(nodes) for i in range(per_node)]


def _job(**fields) -> dict:
    command = [sys.executable, "-m", "drape.train", "--job", "s3://bucket/runs/r/identity/job.json"]
    return {
        "id": "stage-training-abc",
        "kind": "stage-training",
        "stage": "identity",
        "attempts": 2,
        "command": json.dumps(command),
        "env": json.dumps({"DRAPE_INFERENCE_EXCLUSIVE": "1"}),
        "labels": json.dumps({"launch": "torchrun"}),
        **fields,
    }


def test_the_batch_script_asks_slurm_for_exactly_where_drape_placed_the_job(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "never-in-a-script")
    settings = SlurmLauncherConfig(gres_types={"H100-80GB": "h100"}, mem_per_gpu_gib=160, partition="gpu", cpus_per_gpu=10)
    script = batch_script(_job(), _gpus(2, 8), settings, tmp_path / "job.log")
    lines = script.splitlines()
    for directive in (
        "--job-name=drape-stage-training-abc-a2",
        "--comment=drape:stage-training-abc",
        "--nodes=2",
        "--nodelist=n0,n1",
        "--gres=gpu:h100:8",
        "--cpus-per-task=80",
        "--mem-per-gpu=160G",
        "--signal=B:USR1@300",
        "--requeue",
        "--partition=gpu",
    ):
        assert f"#SBATCH {directive}" in lines, directive
    assert "export DRAPE_INFERENCE_EXCLUSIVE=1" in lines and "never-in-a-script" not in script
    task = next(line for line in lines if line.startswith("srun "))
    assert "--nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d" in task and "is_host=$((SLURM_NODEID == 0))" in task
    assert "-m drape.train --job s3://bucket/runs/r/identity/job.json" in task
    done = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr  # the shell reads it


def test_a_job_that_is_not_torchrun_runs_as_it_is_and_uneven_placements_are_refused(tmp_path):
    plain = batch_script(_job(labels="{}"), _gpus(1, 1), SlurmLauncherConfig(), tmp_path / "log")
    assert "torch.distributed.run" not in plain and "#SBATCH --gres=gpu:1" in plain
    uneven = [*_gpus(1, 2), GpuState("n1/gpu0", "n1", "H100-80GB", 80.0)]
    with pytest.raises(SlurmError, match="uneven"):
        batch_script(_job(), uneven, SlurmLauncherConfig(), tmp_path / "log")
    assert job_name({"id": "a b;c", "attempts": 0}) == "drape-a-b-c-a1"


def test_the_slurm_engine_needs_whole_gpus_and_names_shells_cannot_read(tmp_path):
    with pytest.raises(ValidationError, match="max_jobs_per_gpu to 1"):
        QueueConfig(launcher="slurm")
    assert QueueConfig(launcher="slurm", max_jobs_per_gpu=1).slurm.requeue
    with pytest.raises(ValidationError, match="partition"):
        SlurmLauncherConfig(partition="gpu; rm -rf /")


def test_a_job_wider_than_a_node_takes_whole_idle_nodes_and_the_others_plan_as_before():
    fleet = _gpus(3, 2, model="cpu", total=16.0)
    wide = JobRequest("wide", 5, 0.0, 4, 2.0, 60.0)
    narrow = JobRequest("narrow", 3, 1.0, 1, 2.0, 60.0)
    placed = {p.job_id: p.gpus for p in spanning(plan_fifo_exclusive)([wide, narrow], fleet, [], 10.0, PolicyConfig())}
    assert placed["wide"] == ("n0/gpu0", "n0/gpu1", "n1/gpu0", "n1/gpu1")  # a baseline: whole nodes, by name
    assert placed["narrow"][0].startswith("n2/")
    spans = PolicyConfig(span_nodes=True)  # drape: k nodes × g GPUs of one model, the fullest nodes first
    placed = {p.job_id: p.gpus for p in plan_drape([wide, narrow], fleet, [], 10.0, spans)}
    assert placed["wide"] == ("n0/gpu0", "n0/gpu1", "n1/gpu0", "n1/gpu1") and placed["narrow"][0].startswith("n2/")
    fleet[0].jobs, fleet[0].allocated_gib = 1, 2.0  # n0 busy: the wide job takes n1 and n2
    placed = {p.job_id: p.gpus for p in plan_drape([wide], fleet, [], 10.0, spans)}
    assert {uuid.split("/")[0] for uuid in placed["wide"]} == {"n1", "n2"}
    three = JobRequest("three", 5, 0.0, 3, 2.0, 60.0)  # 3 nodes × 1: n0's free GPU, then n1 and n2
    assert {uuid.split("/")[0] for uuid in plan_drape([three], fleet, [], 10.0, spans)[0].gpus} == {"n0", "n1", "n2"}
    assert plan_drape([three], fleet, [], 10.0, PolicyConfig()) == []  # without spanning: one node each
    assert fits_across_nodes(wide, fleet) and not fits_across_nodes(JobRequest("odd", 5, 0.0, 5, 2.0, 60.0), fleet)
    assert unplaceable(4, 2.0, fleet, across_nodes=True) is None
    assert "no node of the fleet can hold it" in (unplaceable(4, 2.0, fleet) or "")
    too_big = unplaceable(4, 32.0, fleet, across_nodes=True) or ""
    assert "no node" in too_big and "Nor can nodes" not in too_big  # no GPU holds it: the memory is the reason
    # too wide for the nodes together: the message names the split that comes closest, not only one node
    eight, five = (unplaceable(width, 2.0, fleet, across_nodes=True) or "" for width in (8, 5))
    assert "at best 4 node(s) × 2 GPU(s) of cpu, where the fleet has 3 such node(s)" in eight
    assert "at best 5 node(s) × 1 GPU(s) of cpu, where the fleet has 3 such node(s)" in five


def test_gpu_hours_come_from_sacct_runs_or_the_request_when_sacct_has_no_gpus():
    assert _gpus_of("billing=4,cpu=4,gres/gpu=8,mem=16G,node=2") == 8 and _gpus_of("cpu=2,mem=4000M") is None
    assert _requested_gpus({"TresPerNode": "gres:gpu:2", "NumNodes": "2"}) == 4
    run = SlurmRun("7", "drape-stage-training-abc-a1", "COMPLETED", 1000.0, 1000.0 + 1800, None)
    assert run.queue_job_id == "stage-training-abc"
    assert run_gpu_hours(run, 4) == pytest.approx(2.0) and run_gpu_hours(run) == 0.0
    assert run_gpu_hours(SlurmRun("7", "x", "RUNNING", 1000.0, None, 8)) == 0.0


def test_the_h100_config_s_sbatch_script_prints_from_the_cli():
    from typer.testing import CliRunner

    from drape.cli import app

    args = ["queue", "sbatch", "--config", str(REPO / "configs" / "h100.yaml"), "--python", "/opt/drape/bin/python"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "#SBATCH --gres=gpu:8" in result.output and "--nproc-per-node=8" in result.output
    assert "# memory profile:" in result.output and "/opt/drape/bin/python -m torch.distributed.run" in result.output
    refused = CliRunner().invoke(app, [*args, "--nodes", "3"])
    assert refused.exit_code != 0 and "do not split evenly over 3 node(s)" in refused.output


def test_a_requeued_job_held_by_slurm_is_released_after_the_configured_wait(tmp_path, monkeypatch):
    """`queue.slurm.requeued_start_after_seconds`: a job Slurm requeued (Restarts > 0) and holds on
    BeginTime is released with `scontrol update StartTime=now` once it has waited that long; a first
    run waiting on BeginTime, or a requeued job waiting for resources, is left alone."""
    from scheduler.engines.slurm import launcher as slurm

    clock = [1000.0]
    monkeypatch.setattr(slurm.time, "monotonic", lambda: clock[0])
    launcher = slurm.SlurmLauncher(SlurmLauncherConfig(requeued_start_after_seconds=30), tmp_path / "l", tmp_path / "s")
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(launcher, "_run", lambda *argv, **_: calls.append(argv) or "")
    requeued = {"JobState": "PENDING", "Reason": "BeginTime", "Restarts": "1"}
    assert launcher._pending("q1", "7", requeued, "BeginTime") is None
    clock[0] += 29
    launcher._pending("q1", "7", requeued, "BeginTime")
    launcher._pending("q2", "8", {**requeued, "Restarts": "0"}, "BeginTime")  # a first run's own --begin
    launcher._pending("q3", "9", {**requeued, "Reason": "Resources"}, "Resources")
    assert calls == []
    clock[0] += 1
    launcher._pending("q1", "7", requeued, "BeginTime")
    assert calls == [("scontrol", "update", "JobId=7", "StartTime=now")]
    unset = slurm.SlurmLauncher(SlurmLauncherConfig(), tmp_path / "l", tmp_path / "s")
    monkeypatch.setattr(unset, "_run", lambda *argv, **_: calls.append(argv) or "")
    clock[0] += 3600
    unset._pending("q1", "7", requeued, "BeginTime")
    assert len(calls) == 1  # unset: Slurm's own hold (AuthInfo cred_expire)


def test_a_local_job_gets_an_explicit_environment(monkeypatch):
    monkeypatch.setenv("PGPASSWORD", SENTINEL)
    monkeypatch.setenv("SOME_TOKEN", SENTINEL)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("DRAPE_CRASH_AT", "x")
    env = job_environment(tiny_config(TINY.parent).queue.job_environment)
    assert "PGPASSWORD" not in env and "SOME_TOKEN" not in env
    assert env["AWS_SECRET_ACCESS_KEY"] == "aws-secret" and env["DRAPE_CRASH_AT"] == "x" and "PATH" in env
    assert "AWS_SECRET_ACCESS_KEY" not in job_environment(())


_STUB_SRUN = """#!/bin/bash
# the job step: says what the test asks ($STUB_SAYS, one line each), then trains until told to stop, and
# exits 1 on SIGTERM as torchrun does when it is stopped, whatever its ranks did
trap 'exit 1' TERM
printf '%s\\n' "$STUB_SAYS"
touch "$STUB_READY"
while :; do sleep 0.05; done
"""


def _run_batch_body(tmp_path: Path, says: list[str]) -> tuple[int, str, str]:
    """The rendered batch script run by bash with stub srun, scontrol and scancel (`scancel` of the step
    fails, so the script signals srun itself), USR1 sent once the step has said `says`: (exit status,
    the job's log, the Slurm commands the script ran)."""
    stubs, calls, log = tmp_path / "bin", tmp_path / "calls", tmp_path / "job.log"
    stubs.mkdir()
    (stubs / "srun").write_text(_STUB_SRUN)
    (stubs / "scontrol").write_text(
        f'#!/bin/bash\necho "scontrol $*" >> {calls}\n[ "$1 $2" = "show hostnames" ] && echo n0\nexit 0\n'
    )
    (stubs / "scancel").write_text(f'#!/bin/bash\necho "scancel $*" >> {calls}\nexit 1\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    script = batch_script(_job(), _gpus(1, 2), SlurmLauncherConfig(), log)
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n0",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_RESTART_COUNT": "0",
        "STUB_SAYS": "\n".join(says),
        "STUB_READY": str(tmp_path / "ready"),
    }
    with log.open("w") as out:
        batch = subprocess.Popen(["bash", "-c", script], stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 30
            while not (tmp_path / "ready").exists():
                assert batch.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            batch.send_signal(signal.SIGUSR1)
            status = batch.wait(timeout=30)
        finally:
            batch.kill()
    return status, log.read_text(), calls.read_text() if calls.exists() else ""


def test_a_time_limit_warning_after_the_last_step_ends_the_job_as_done_not_failed(tmp_path, monkeypatch):
    """USR1 met the job's wrap-up: torchrun exits 1, but the trainer said this run trained to the end
    and published its result, so the job is done: exit 0, no requeue (a loaded machine failed such
    a finished job and the queue ran it again)."""
    monkeypatch.setenv(stop.RUN_MARK_VARIABLE, "7.0")
    status, log, calls = _run_batch_body(tmp_path, [stop.finished_line("identity")])
    assert status == 0, log
    assert "drape: USR1 came after run 7.0 trained to the end and published its result: the job is done" in log, log
    assert "requeue" not in calls and "scancel --signal=TERM 7.0" in calls, calls


@pytest.mark.parametrize("mark", ["7.1", "-"])
def test_a_finished_line_of_another_run_is_no_word_for_this_one(tmp_path, monkeypatch, mark):
    """The line must name this run (``$DRAPE_RUN_MARK``): a requeued job's earlier run, or none, says nothing."""
    monkeypatch.setenv(stop.RUN_MARK_VARIABLE, mark)
    status, log, calls = _run_batch_body(tmp_path, [stop.finished_line("identity")])
    assert status != 0 and "the job is done" not in log, log
    assert "drape: error: USR1 came " in log and "requeue" not in calls, (log, calls)


def test_a_time_limit_warning_mid_run_requeues_on_the_trainer_s_word(tmp_path, monkeypatch):
    """The branch beside it: a checkpoint of this run published, not finished, so the job is requeued."""
    monkeypatch.setenv(stop.RUN_MARK_VARIABLE, "7.0")
    status, log, calls = _run_batch_body(tmp_path, [stop.published_line(12, 0)])
    assert status != 0 and "the job is done" not in log, log
    assert "drape: requeueing job 7; its next run resumes from its checkpoint of step 12" in log, log
    assert "scontrol requeue 7" in calls, calls
