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


def _run_job(store, config, stage="texture", run="run-1", state="succeeded"):
    """A stage job of `run` in the queue, claimed and ended in `state` (or left queued)."""
    from scheduler.policy import GpuState, Placement

    job = store.submit(train_job_spec(config, stage=stage, mode="full", run_id=run, command=["true"]))
    if state != "queued":
        store.register_gpus([GpuState("n/gpu0", "n", "H100", 80.0)])
        assert store.claim(Placement(job, ("n/gpu0",), 1.0), "dispatcher", 60, 4)
        store.finish(job, exit_code=0 if state == "succeeded" else 1)
    assert store.get(job)["state"] == state
    return job


def test_the_newest_succeeded_stage_job_of_a_run_is_found_and_no_other(config, tmp_path):
    from scheduler.queue.once import live_job, succeeded_job

    store = JobStore(f"sqlite:///{tmp_path}/queue.db")
    assert succeeded_job(store, "stage-training", "texture", "run-1") is None
    _run_job(store, config, state="failed")
    assert succeeded_job(store, "stage-training", "texture", "run-1") is None  # failed: not a result
    first = _run_job(store, config)
    second = _run_job(store, config)
    _run_job(store, config, stage="geometry")
    _run_job(store, config, run="run-2")
    assert succeeded_job(store, "stage-training", "texture", "run-1")["id"] == second != first
    assert succeeded_job(store, "finetune", "texture", "run-1") is None  # another kind
    assert live_job(store, "stage-training", "texture", "run-1") is None
    queued = _run_job(store, config, state="queued")
    assert live_job(store, "stage-training", "texture", "run-1")["id"] == queued


def test_a_resumed_run_takes_the_result_of_a_stage_job_that_succeeded_while_it_was_down(config, tmp_path, monkeypatch, capsys):
    """The queue retried the stage's job after the run's flow died and the retry ended before the
    resumed flow reached the stage: its result is taken, no second job is queued (it would only
    resume from its last checkpoint and train nothing). Without the result, the stage is queued."""
    from types import SimpleNamespace

    import tasks.stages as stages
    from drape import pipeline
    from scheduler.dispatch import dispatcher

    url = f"sqlite:///{tmp_path}/queue.db"
    store = JobStore(url)
    job = _run_job(store, config)
    queued = config.model_copy(update={"queue": config.queue.model_copy(update={"enabled": True, "url": url})})
    context = SimpleNamespace(run_id="run-1", mode="full", resumed=True)
    ready, calls = {"texture": True}, []
    monkeypatch.setattr(pipeline, "train_result_ready", lambda config, context, stage: ready[stage], raising=False)
    monkeypatch.setattr(pipeline, "finish_train", lambda config, context, stage: calls.append(("finish", stage)) or "result")
    monkeypatch.setattr(pipeline, "train_command", lambda config, context, stage: ["true"])
    monkeypatch.setattr(pipeline, "warm_node", lambda config, context, stage: None)
    monkeypatch.setattr(dispatcher, "submit_and_wait", lambda config, spec, on_line: calls.append(("submit", spec.stage)))
    assert stages.train.fn(queued, context, "texture") == "result"
    assert calls == [("finish", "texture")] and len(store.jobs()) == 1
    assert f"train-texture: {job} succeeded before the run was resumed; taking its result" in capsys.readouterr().out
    ready["texture"] = False  # taken by a finish_train before the flow died: train it (resumes from the store)
    calls.clear()
    stages.train.fn(queued, context, "texture")
    assert calls == [("submit", "texture"), ("finish", "texture")]
