"""A Slurm controller that does not answer is not a job that ended (scheduler/engines/slurm/launcher.py).

Under load slurmctld can miss ``MessageTimeout``: ``scontrol show job`` then exits 1 with "Socket
timed out". The launcher once read any failed ``scontrol`` as "Slurm no longer knows the job" and
asked sacct, whose newest record of a requeued job is its interrupted run (REQUEUED, NODE_FAIL) or
nothing yet: the queue failed the job and retried it (a second sbatch while Slurm ran the first:
test_slurm's USR1 and node-failure tests saw attempts 2 at a load of 4), or a restarted dispatcher
requeued a job it did not "see". Only scontrol's own "Invalid job id specified" means gone."""

from __future__ import annotations

import subprocess

from drape.config import SlurmLauncherConfig
from scheduler.engines.slurm.launcher import SlurmLauncher

HANDLE = "slurm:41:drape-q1-a1"
TIMED_OUT = "slurm_load_jobs error: Socket timed out on send/recv operation"
REQUEUED_RUN = "41|drape-q1-a1|REQUEUED|2026-12-05T23:50:01|2026-12-05T23:50:40|billing=4,cpu=4,gres/gpu=4,node=2\n"


def _launcher(tmp_path, monkeypatch, scontrol_error: str, sacct: str) -> tuple[SlurmLauncher, list[str]]:
    asked: list[str] = []

    def run(argv, **_):
        asked.append(argv[0])
        if argv[0] == "scontrol":
            return subprocess.CompletedProcess(argv, 1, "", scontrol_error)
        return subprocess.CompletedProcess(argv, 0, sacct, "")

    monkeypatch.setattr("scheduler.engines.slurm.launcher.subprocess.run", run)
    return SlurmLauncher(SlurmLauncherConfig(accounting="jobcomp"), tmp_path / "logs", tmp_path / "scripts"), asked


def test_a_controller_that_times_out_leaves_a_requeued_job_running_and_seen(tmp_path, monkeypatch, capsys):
    launcher, asked = _launcher(tmp_path, monkeypatch, TIMED_OUT, REQUEUED_RUN)
    assert launcher.poll("q1", HANDLE) is None  # before: Outcome(1, "Slurm job 41 REQUEUED ...") and a second sbatch
    assert asked == ["scontrol"]  # sacct's interrupted run is never taken for the job's end
    first_run, _ = _launcher(tmp_path, monkeypatch, TIMED_OUT, "")  # its first run: sacct has no record yet
    assert first_run.sees(HANDLE) is True  # a restarted dispatcher adopts it (before: requeued it beside itself)
    assert "q1: Slurm did not answer (scontrol show job 41: " in capsys.readouterr().out


def test_a_job_scontrol_says_it_does_not_know_ends_as_sacct_has_it(tmp_path, monkeypatch):
    launcher, _ = _launcher(tmp_path, monkeypatch, "slurm_load_jobs error: Invalid job id specified", "")
    gone = launcher.poll("q1", HANDLE)
    assert gone is not None and gone.exit_code == -1 and "Slurm no longer knows job 41" in gone.message
    assert launcher.sees(HANDLE) is False
    completed = REQUEUED_RUN.replace("REQUEUED", "COMPLETED")
    finished, _ = _launcher(tmp_path, monkeypatch, "slurm_load_jobs error: Invalid job id specified", completed)
    assert finished.sees(HANDLE) is True
    done = finished.poll("q1", HANDLE)
    assert done is not None and done.exit_code == 0 and "COMPLETED" in done.message
