"""scheduler/queue/once.py: a run's stage job is queued at most once while it is live."""

from __future__ import annotations

from scheduler.jobs.training import train_job_spec
from scheduler.queue.schema import JobSpec
from scheduler.queue.store import JobStore


def test_a_runs_stage_job_is_queued_once_while_live_and_again_after_it_ended(config, tmp_path, capsys):
    store = JobStore(f"sqlite:///{tmp_path}/queue.db")

    def spec(stage="texture", run="run-1", mode="full"):
        return train_job_spec(config, stage=stage, mode=mode, run_id=run, command=["true"])

    first = store.submit(spec())
    assert store.submit(spec()) == first  # the second submit joins the first
    assert f"texture of run run-1 is already job {first}: not queued twice" in capsys.readouterr().out
    others = {store.submit(spec(stage="geometry")), store.submit(spec(run="run-2")), store.submit(spec(mode="finetune"))}
    assert len(others | {first}) == 4  # another stage, run or kind is another job
    store.cancel(first)
    again = store.submit(spec())  # the first ended: the stage may be queued again (a resumed run's retry)
    assert again != first and store.get(again)["state"] == "queued"
    plain = JobSpec(kind="gate-eval", command=["true"], mem_gib=1, duration_s=60, stage="texture", labels={"run": "run-1"})
    assert store.submit(plain) != store.submit(plain)  # only a run's stage training is kept to one
    assert len(store.jobs()) == 7
