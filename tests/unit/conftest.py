"""Fixtures for unit tests that need a started pipeline run: a tiny config whose stages train for
4 steps and whose gates pass anything, and one stage taken through the whole DAG by the tasks."""

from __future__ import annotations

import json

import pytest

from drape import STAGES
from drape.layout import checkpoint_name
from tasks import stages as t
from tests.conftest import tiny_config

# the lowest thresholds allowed: everything but a collapsed (flat) output passes
PASS_ANYTHING = {
    "identity": {"min_similarity": 1e-6},
    "texture": {"min_fidelity": 1e-6},
    "coherence": {"min_score": 1e-6},
}  # the lowest bounds allowed


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
