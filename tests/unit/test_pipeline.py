"""drape.pipeline: the archive of a stage that wrote sharded (`step-N.dcp`) and whole (`step-N`)
checkpoints side by side, a run's resources built once, where each stage starts, a queue job as one
file, and the registry's description."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from drape import Mode, pipeline
from drape.ops.tracking import Tracker
from drape.storage.retention import read_archive_manifest, verify_archived
from drape.storage.store import ObjectStore


def test_sharded_and_whole_checkpoints_of_one_step_archive(dag_config, one_stage):
    context, *_ = one_stage
    records = [r for r in read_archive_manifest(ObjectStore(dag_config.object_store_url)) if r["run_id"] == context.run_id]
    outcomes = {r["key"].split("/")[4]: r["outcome"] for r in records if r["kind"] == "checkpoint"}
    assert outcomes == {"step-0000002": "passed", "step-0000002.dcp": "passed", "step-0000004": "baseline"}
    verify_archived(ObjectStore(dag_config.object_store_url), records)
    assert not context.stage_dir("identity").exists()  # everything archived, verified, then freed


def test_the_registry_description_is_plain_text(dag_config, one_stage):
    description = Tracker(dag_config).client.get_registered_model("drape-tryon").description
    assert "identity-baseline" in description and "<" not in description and ">" not in description


def test_a_run_builds_its_resources_once_and_drops_them_when_it_closes(dag_config, monkeypatch):
    import drape.pipeline.run as run_module

    reads = []
    real = run_module.read_manifest
    monkeypatch.setattr(run_module, "read_manifest", lambda store, prefix: reads.append(prefix) or real(store, prefix))
    context = pipeline.start_run(dag_config, run_name="unit-resources")
    first = pipeline.resources(dag_config, context)
    pipeline.prestage(dag_config, context, "texture")
    assert pipeline.resources(dag_config, context) is first and reads == []  # start_run's store, tracker and manifest
    pipeline.close_run(dag_config, context, "FINISHED")
    rebuilt = pipeline.resources(dag_config, context)  # e.g. a task in another process: built once, from the manifest
    assert rebuilt is not first and pipeline.resources(dag_config, context) is rebuilt and len(reads) == 1
    pipeline.close_run(dag_config, context, "FINISHED")


def test_where_each_stage_starts(dag_config, one_stage):
    context, *_ = one_stage
    assert pipeline.start_checkpoint(context, "identity") is None  # a full run's first stage: fresh weights
    assert pipeline.start_checkpoint(context, "texture") == str(context.baseline_dir("identity") / "checkpoint")
    with pytest.raises(FileNotFoundError, match="texture baseline"):  # never fresh weights in silence
        pipeline.start_checkpoint(context, "geometry")
    finetune = replace(context, mode=Mode.FINETUNE)
    assert pipeline.start_checkpoint(finetune, "identity") == str(context.baseline_dir("identity") / "checkpoint")
    job = pipeline.stage_job(dag_config, finetune, "identity")
    assert job.init_checkpoint == pipeline.start_checkpoint(finetune, "identity") and job.mode is Mode.FINETUNE
    assert job.out_dir == context.stage_dir("identity") and job.mlflow_run == context.stage_run_ids["identity"]


def test_a_queue_job_is_one_file_read_back_unchanged(dag_config, one_stage):
    from drape.training.jobs.stage_job import StageJob

    context, *_ = one_stage
    command = pipeline.train_command(dag_config, context, "texture")
    result_path = context.paths("texture").train_result
    assert command[1:4] == ["-m", "drape.train", "--job"] and command[-2:] == ["--result", str(result_path)]
    job = StageJob.read(command[4])
    assert job == pipeline.stage_job(dag_config, context, "texture")
    Path(command[4]).write_text(json.dumps({"schema": "something/else"}))
    with pytest.raises(ValueError, match="not a drape stage job"):
        StageJob.read(command[4])
    shutil.rmtree(context.stage_dir("texture"))


def test_a_flow_node_that_lost_its_disk_gets_the_live_baseline_back_from_the_registry(dag_config, one_stage):
    """The flow pod rescheduled elsewhere: the stage after identity still starts from identity's
    baseline, rebuilt from the registry version and verified; a damaged copy there is refused."""
    from drape.training.checkpoints.checkpoint import CheckpointError

    context, *_ = one_stage
    live = context.layout.baseline("identity")
    kept = live.root.with_name("identity-kept")
    shutil.copytree(live.root, kept)
    try:
        shutil.rmtree(live.root)
        job = pipeline.stage_job(dag_config, context, "texture")
        assert job.init_checkpoint == str(live.checkpoint)
        files = sorted(p.relative_to(live.checkpoint) for p in live.checkpoint.rglob("*") if p.is_file())
        assert files and all((live.checkpoint / f).read_bytes() == (kept / "checkpoint" / f).read_bytes() for f in files)
        assert sorted(p.name for p in live.outputs.iterdir()) == sorted(p.name for p in (kept / "outputs").iterdir())
        assert json.loads(live.record.read_text())["version"] == json.loads((kept / "baseline.json").read_text())["version"]
        assert not live.staging.exists()
        # a registry copy that does not match its manifest never becomes the live baseline
        shutil.rmtree(live.root)
        original = Tracker.download

        def damaged(self, uri, destination):
            found = original(self, uri, destination)
            for weights in Path(destination).rglob("*.safetensors"):
                weights.write_bytes(b"not the weights")
            return found

        Tracker.download = damaged  # type: ignore[method-assign]
        try:
            with pytest.raises(CheckpointError, match="does not match"):
                pipeline.stage_job(dag_config, context, "texture")
        finally:
            Tracker.download = original  # type: ignore[method-assign]
        assert not live.root.exists()
    finally:
        shutil.rmtree(live.root, ignore_errors=True)
        shutil.rmtree(live.staging, ignore_errors=True)
        kept.rename(live.root)


def test_the_flow_modules_load_no_torch_diffusers_or_mlflow_and_the_pipeline_names_resolve():
    """`prefect deploy` imports every flow module: they load Prefect and drape's config only, and
    each `drape.pipeline` name loads its module when first used."""
    import subprocess
    import sys

    flows = ["staged_training", "prestage_dataset", "retention_sweep", "queue_dispatcher", "inference_benchmark"]
    probe = "import sys; " + "; ".join(f"import flows.{name}" for name in flows)
    probe += "; print(sorted(m for m in ('torch', 'diffusers', 'mlflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    assert set(pipeline.__all__) == set(pipeline._WHERE)  # every exported name has its module
    assert all(getattr(pipeline, name) is not None for name in pipeline.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        pipeline.nothing  # noqa: B018


def test_a_missing_previous_baseline_is_an_error_not_fresh_weights(tmp_path):
    from drape.layout import LiveLayout
    from drape.pipeline.stages import start_checkpoint

    class Context:
        mode, layout = Mode.FULL, LiveLayout(tmp_path)

    assert start_checkpoint(Context(), "identity") is None
    with pytest.raises(FileNotFoundError, match="identity baseline.*drape storage restore"):
        start_checkpoint(Context(), "texture")
