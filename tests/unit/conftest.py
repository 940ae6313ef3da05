"""Fixtures for unit tests that need a started pipeline run: a tiny config whose stages train for
4 steps and whose gates pass anything, and one stage taken through the whole DAG by the tasks."""

from __future__ import annotations

import json

import pytest

from drape import STAGES
from drape.layout import checkpoint_name
from tasks import stages as t
from tests.conftest import PASS_ANYTHING, tiny_config

# the lowest thresholds allowed: everything but a collapsed (flat) output passes


@pytest.fixture(scope="session")
def dag_config(tmp_path_factory):
    steps = {stage: {"steps": 4} for stage in STAGES}
    return tiny_config(
        tmp_path_factory.mktemp("dag") / "drape",
        fresh_mlflow=True,  # the run creates MLflow's database itself
        train={"checkpoint_every": 2, "stages": steps},
        gates=PASS_ANYTHING,
    )


@pytest.fixture(scope="session")
def one_stage(dag_config):
    config = dag_config
    """identity through start-run, prestage, train, gate, snapshot, archive, summarize, via `.fn()`;
    before archive the stage also holds a sharded intermediate next to the whole checkpoint of its step."""
    artifacts = []
    context = t.start_run.fn(config, "unit-tasks", "full")
    staged = t.prestage.fn(config, context, "identity")
    trained = t.train.fn(config, context, "identity")
    original = t.create_markdown_artifact
    t.create_markdown_artifact = lambda markdown, key, description: artifacts.append((key, markdown))
    try:
        report = t.gate.fn(config, context, "identity", trained.checkpoint)
    finally:
        t.create_markdown_artifact = original
    row = t.passed_gate.fn(config, context, "identity", trained, report)
    snap = t.snapshot.fn(config, context, "identity", row)
    sharded = context.paths("identity").checkpoints / checkpoint_name(2, sharded=True)
    sharded.mkdir()
    (sharded / "__0_0.distcp").write_bytes(b"shard of rank 0")
    (sharded / "manifest.json").write_text(json.dumps({"format": "dcp", "step": 2}))
    archived = t.archive.fn(config, context, "identity", {**row, "version": snap["version"]})
    summary = t.summarize.fn(config, context, [archived])
    return context, staged, trained, report, artifacts, snap, archived, summary


def seven_texture_steps(config, **train):
    """`config` with a 7-step texture stage checkpointed every 3 steps, and `train` overrides."""
    data = config.model_dump(mode="json")
    data["train"].update({"checkpoint_every": 3, **train})
    data["train"]["stages"]["texture"]["steps"] = 7
    return type(config).model_validate(data)


@pytest.fixture(scope="module")
def texture_data(tiny_dataset):
    from drape.data.partition import split_data

    directory, manifest, _ = tiny_dataset
    return split_data(directory, manifest, "texture")


class Killed(Exception):
    pass


def uninterrupted_and_resumed(cfg, data, folder):
    """The texture stage of `cfg` trained whole, and trained again killed after step 5 then resumed
    (from its step-3 checkpoint, which the test checks): the two results."""
    from drape.training.checkpoints.checkpoint import list_checkpoints
    from drape.training.loop.trainer import train_stage

    full = train_stage(cfg, stage="texture", data=data, out_dir=folder / "full", init_checkpoint=None)

    def die_at_step_5(done, total):
        if done == 5:
            raise Killed

    with pytest.raises(Killed):
        train_stage(cfg, stage="texture", data=data, out_dir=folder / "killed", init_checkpoint=None, progress=die_at_step_5)
    assert [p.name for p in list_checkpoints(folder / "killed" / "checkpoints")] == ["step-0000003"]
    return full, train_stage(cfg, stage="texture", data=data, out_dir=folder / "killed", init_checkpoint=None)
