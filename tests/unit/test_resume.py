"""drape.pipeline.resume: what a run records of itself, and what resuming it checks and restores."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drape.pipeline import RunContext
from drape.pipeline.resume import (
    ResumeError,
    load_context,
    load_progress,
    mark_closed,
    progress_key,
    restore_newest_checkpoint,
    run_of_flow_run,
    save_context,
    save_progress,
)
from drape.training.checkpoints.checkpoint import load_model


def test_a_run_records_its_context_and_its_stages_progress(dag_config, one_stage):
    context, *_ = one_stage
    store = _store(dag_config)
    with pytest.raises(ResumeError, match=f"run {context.run_id} finished; there is nothing to resume"):
        load_context(store, context.run_id, dag_config.name, RunContext)  # summarize closed it
    open_copy = dataclasses.replace(context, run_id="20260101-000000-open00")
    save_context(store, open_copy, dag_config.name, "flow-run-1")
    assert load_context(store, open_copy.run_id, dag_config.name, RunContext) == open_copy
    assert run_of_flow_run(store, "flow-run-1") == open_copy.run_id and run_of_flow_run(store, "flow-run-2") is None
    progress = load_progress(store, context.run_id)
    assert list(progress) == ["identity"] and progress["identity"]["phase"] == "done"
    assert progress["identity"]["row"]["archived_bytes"] > 0 and progress["identity"]["row"]["version"]


def test_resuming_refuses_what_cannot_be_resumed(dag_config, one_stage):
    context, *_ = one_stage
    store = _store(dag_config)
    with pytest.raises(ResumeError, match="no run 'nope' to resume"):
        load_context(store, "nope", dag_config.name, RunContext)
    with pytest.raises(ResumeError, match="is not a drape run id"):
        load_context(store, "../../etc", dag_config.name, RunContext)
    with pytest.raises(ResumeError, match=f"run {context.run_id} ran config 'tiny', not 'other'"):
        load_context(store, context.run_id, "other", RunContext)
    fake = dataclasses.replace(context, run_id="20260101-000000-failed")
    save_context(store, fake, dag_config.name, None)
    mark_closed(store, fake.run_id, "FAILED")  # an aborted run may be resumed
    assert load_context(store, fake.run_id, dag_config.name, RunContext).run_id == fake.run_id
    save_progress(store, fake.run_id, "texture", "gated", {"stage": "texture"})  # texture without identity
    with pytest.raises(ResumeError, match="not a prefix"):
        load_progress(store, fake.run_id)
    store.put_bytes(b"{not json", progress_key(fake.run_id, "identity"))
    with pytest.raises(ResumeError, match="is not JSON"):
        load_progress(store, fake.run_id)


def test_the_newest_archived_checkpoint_comes_back_verified(dag_config, one_stage, tmp_path):
    context, _, trained, *_ = one_stage  # identity was archived: step-0000002.dcp and step-0000004 (whole)
    restored = restore_newest_checkpoint(_store(dag_config), context.run_id, "identity", tmp_path / "checkpoints")
    assert restored == tmp_path / "checkpoints" / "step-0000004"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-0000004"]  # no staging left
    weights = load_model(restored).state_dict()
    assert all(torch.isfinite(value).all() for value in weights.values())
    assert restore_newest_checkpoint(_store(dag_config), context.run_id, "texture", tmp_path / "other") is None


def _store(config):
    from drape.storage.store import open_store

    return open_store(config)
