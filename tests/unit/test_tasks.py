"""The Prefect tasks' logic through `.fn()` (no orchestrator): one stage through the whole DAG, each
task one core call, plus the pipeline's resources, start checkpoint and the archive of a stage that
wrote sharded (`step-N.dcp`) and whole (`step-N`) checkpoints side by side."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from drape import STAGES, Mode, pipeline
from drape.layout import checkpoint_name
from drape.ops.tracking import Tracker
from drape.storage.retention import read_archive_manifest, verify_archived
from drape.storage.store import ObjectStore
from tasks import stages as t
from tests.conftest import tiny_config

PASS_ANYTHING = {"identity": {"min_similarity": -1.0}, "texture": {"min_fidelity": -1.0}, "coherence": {"min_score": -1.0}}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    steps = {stage: {"steps": 4} for stage in STAGES}
    return tiny_config(
        tmp_path_factory.mktemp("tasks") / "drape", train={"checkpoint_every": 2, "stages": steps}, gates=PASS_ANYTHING
    )


@pytest.fixture(scope="module")
def one_stage(config):
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
    snap = t.snapshot.fn(config, context, "identity", trained.checkpoint, report)
    sharded = context.paths("identity").checkpoints / checkpoint_name(2, sharded=True)
    sharded.mkdir()
    (sharded / "__0_0.distcp").write_bytes(b"shard of rank 0")
    (sharded / "manifest.json").write_text(json.dumps({"format": "dcp", "step": 2}))
    archived = t.archive.fn(config, context, "identity")
    summary = t.summarize.fn(config, context, [pipeline.StageRecord(trained, report, snap, archived)])
    return context, staged, trained, report, artifacts, snap, archived, summary


def test_the_tasks_run_a_stage_end_to_end(config, one_stage):
    context, staged, trained, report, artifacts, snap, archived, summary = one_stage
    assert context.mode is Mode.FULL and set(context.stage_run_ids) == set(STAGES)
    assert staged["stage"] == "identity" and staged["shards"] > 0
    assert trained.steps == 4 and Path(trained.checkpoint).name == "step-0000004"
    assert report.passed and [key for key, _ in artifacts] == ["gate-report-identity"]
    assert "# Gate `identity`: **PASS**" in artifacts[0][1] and "| identity |" in artifacts[0][1]
    assert snap["alias"] == "identity-baseline" and Path(snap["checkpoint"]).is_dir()
    assert summary["stages"][0]["stage"] == "identity" and summary["stages"][0]["verdict"] == "pass"
    assert summary["stages"][0]["archived_bytes"] == archived["archived_bytes"] > 0


def test_sharded_and_whole_checkpoints_of_one_step_archive(config, one_stage):
    context, *_ = one_stage
    records = [r for r in read_archive_manifest(ObjectStore(config.object_store_url)) if r["run_id"] == context.run_id]
    outcomes = {r["key"].split("/")[4]: r["outcome"] for r in records if r["kind"] == "checkpoint"}
    assert outcomes == {"step-0000002": "passed", "step-0000002.dcp": "passed", "step-0000004": "baseline"}
    verify_archived(ObjectStore(config.object_store_url), records)
    assert not context.stage_dir("identity").exists()  # everything archived, verified, then freed


def test_the_registry_description_is_plain_text(config, one_stage):
    description = Tracker(config).client.get_registered_model("drape-tryon").description
    assert "identity-baseline" in description and "<" not in description and ">" not in description


def test_a_run_builds_its_resources_once_and_drops_them_when_it_closes(config, monkeypatch):
    import drape.pipeline.run as run_module

    reads = []
    real = run_module.read_manifest
    monkeypatch.setattr(run_module, "read_manifest", lambda store, prefix: reads.append(prefix) or real(store, prefix))
    context = pipeline.start_run(config, run_name="unit-resources")
    first = pipeline.resources(config, context)
    pipeline.prestage(config, context, "texture")
    assert pipeline.resources(config, context) is first and reads == []  # start_run's store, tracker and manifest
    pipeline.close_run(config, context, "FINISHED")
    rebuilt = pipeline.resources(config, context)  # e.g. a task in another process: built once, from the manifest
    assert rebuilt is not first and pipeline.resources(config, context) is rebuilt and len(reads) == 1
    pipeline.close_run(config, context, "FINISHED")


def test_where_each_stage_starts(config, one_stage):
    context, *_ = one_stage
    assert pipeline.start_checkpoint(context, "identity") is None  # a full run's first stage: fresh weights
    assert pipeline.start_checkpoint(context, "texture") == str(context.baseline_dir("identity") / "checkpoint")
    assert pipeline.start_checkpoint(context, "geometry") is None  # texture has no baseline yet
    finetune = replace(context, mode=Mode.FINETUNE)
    assert pipeline.start_checkpoint(finetune, "identity") == str(context.baseline_dir("identity") / "checkpoint")
    job = pipeline.stage_job(config, finetune, "identity")
    assert job.init_checkpoint == pipeline.start_checkpoint(finetune, "identity") and job.mode is Mode.FINETUNE
    assert job.out_dir == context.stage_dir("identity") and job.mlflow_run == context.stage_run_ids["identity"]


def test_a_queue_job_is_one_file_read_back_unchanged(config, one_stage):
    from drape.training.stage_job import StageJob

    context, *_ = one_stage
    command, result_path = pipeline.train_command(config, context, "texture")
    assert command[1:4] == ["-m", "drape.train", "--job"] and command[-2:] == ["--result", str(result_path)]
    job = StageJob.read(command[4])
    assert job == pipeline.stage_job(config, context, "texture")
    Path(command[4]).write_text(json.dumps({"schema": "something/else"}))
    with pytest.raises(ValueError, match="not a drape stage job"):
        StageJob.read(command[4])
    shutil.rmtree(context.stage_dir("texture"))


def test_the_relay_keeps_progress_and_errors_only(capsys):
    relay = t._relay("texture")
    for line in ("train-texture: step 3/30 (10%)", "INFO noise", "Traceback (most recent call last):", "ValueError: bad"):
        relay(line)
    assert capsys.readouterr().out.splitlines() == [
        "train-texture: step 3/30 (10%)",
        "Traceback (most recent call last):",
        "ValueError: bad",
    ]
