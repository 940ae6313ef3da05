"""The inference measuring stick and `drape tryon` on a model promoted in a real MLflow registry
(SQLite): renders from the alias, every variant an isolated run with its figures or the reason it
was skipped, the recommended variant written next to the model and read back by `drape tryon`,
the MLflow run, the Prometheus series, and the flow sending the benchmark through the GPU queue
as a job that holds the whole device."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from drape.cli import app
from drape.data.dataset import ensure_dataset
from drape.ops import metrics
from drape.ops.tracking import Tracker
from drape.storage.store import open_store
from tests.conftest import register_untrained_baseline, tiny_config

pytestmark = pytest.mark.slow

INFERENCE = {
    "runs": 10,
    "warmup": 1,
    "concurrency": [2],
    "concurrency_runs": 1,
    "memory_requests": 2,
    "variants": [
        {"name": "bf16", "precision": "bf16"},
        {"name": "sdpa-efficient", "sdpa": "efficient"},  # no CPU kernel: skipped, with torch's reason
        {"name": "half-steps", "steps_fraction": 0.5},
    ],
    "control": {"name": "control", "sdpa": "flash"},  # the kernel the CPU picks anyway: the floor is exact
}
DATA = {"synthetic": {"samples_per_stage": {"identity": 8, "texture": 8, "geometry": 8, "denoise": 8}}, "control_samples": 4}


@pytest.fixture(scope="module")
def promoted(tmp_path_factory):
    """A tiny model registered as `drape-tryon` v1 with the alias denoise-baseline, and its dataset."""
    root = tmp_path_factory.mktemp("inference")
    config = tiny_config(root / "drape", data=DATA, inference=INFERENCE)
    ensure_dataset(config, open_store(config))
    return config, register_untrained_baseline(config, root)


def _cli(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_tryon_renders_the_alias_fetched_from_the_registry(promoted, tmp_path):
    config, path = promoted
    result = _cli("tryon", "-c", str(path), "--inputs", "control-00000,control-00002", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "tryon.json").read_text())
    assert summary["model"] == "denoise-baseline (v1)" and summary["steps"] == config.diffusion.sampling_steps
    assert summary["chosen"].startswith("the reference (no ") and summary["variant"]["precision"] == "fp32"
    assert sorted(p.name for p in (tmp_path / "out").glob("*.png")) == ["control-00000.png", "control-00002.png", "grid.png"]
    assert (config.paths.root_path / "live" / "models" / "v1" / "checkpoint" / "manifest.json").is_file()
    # the same seed renders the same pixels
    again = _cli("tryon", "-c", str(path), "--inputs", "control-00000", "--out", str(tmp_path / "again"))
    assert again.exit_code == 0
    assert (tmp_path / "again" / "control-00000.png").read_bytes() == (tmp_path / "out" / "control-00000.png").read_bytes()


def test_tryon_names_a_bad_alias_sample_or_variant(promoted, tmp_path):
    _, path = promoted
    cases = [
        (("--model", "nope-baseline"), "no such alias of drape-tryon (aliases: denoise-baseline)"),
        (("--inputs", "control-00099"), "control samples ['control-00099'] are not in the control set"),
        (("--variant", "turbo"), "variant 'turbo': expected recommended, reference or one of bf16, sdpa-efficient, half-steps"),
    ]
    for args, message in cases:
        result = _cli("tryon", "-c", str(path), "--out", str(tmp_path / "x"), *args)
        assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


def test_bench_measures_every_variant_and_recommends_one(promoted, tmp_path):
    config, path = promoted
    result = _cli(
        "bench", "inference", "-c", str(path), "--inputs", "control-00000,control-00001", "-v", "bf16", "-v", "sdpa-efficient"
    )
    assert result.exit_code == 0, result.output
    bench = sorted((config.paths.root_path / "live" / "inference").iterdir())[-1]
    report = json.loads((bench / "report.json").read_text())
    rows = {row["name"]: row for row in report["rows"]}
    assert list(rows) == ["reference", "reference-repeat", "control", "bf16", "sdpa-efficient"]
    assert rows["sdpa-efficient"]["status"] == "skipped" and "efficient" in rows["sdpa-efficient"]["why"]
    for name in ("reference", "control", "bf16"):
        row = rows[name]
        assert row["status"] == "measured" and row["requests"] >= 10
        assert 0 < row["denoise_median_s"] <= row["total_median_s"] and row["denoise_median_s"] <= row["denoise_p90_s"]
        assert set(row["quality"]["checks"]) == {"identity", "texture", "coherence"}
        assert 0.9 < row["quality"]["attention_min"] <= 1.0 + 1e-9
        assert set(row["overlap"]) == {"2"}
    assert rows["control"]["quality"]["attention_min"] == pytest.approx(1.0, abs=1e-9)  # the same kernel: no change
    assert report["repeatability"] is not None and report["recommended"] in rows
    assert all(rows[name]["paired"] for name in ("reference-repeat", "control", "bf16"))  # in turns with the reference
    # approval is the floor less the tolerances, and the verdict follows it
    limit = report["thresholds"]["attention_min"]
    assert limit == pytest.approx(1.0 - config.inference.quality.attention_cosine_tolerance)
    assert rows["bf16"]["approved"] == (rows["bf16"]["why"] == "within the noise floor")
    # the recommended variant lies next to the model; `drape tryon` takes it
    written = json.loads((config.paths.root_path / "live" / "models" / "v1" / "inference.json").read_text())
    assert written["variant"]["name"] == report["recommended"] and written["bench"] == report["bench_id"]
    tried = _cli("tryon", "-c", str(path), "--inputs", "control-00000", "--out", str(tmp_path / "t"))
    assert tried.exit_code == 0 and "recommended by the benchmark" in " ".join(tried.output.split())
    # MLflow: a run with each variant's figures; the model version carries the recommendation
    tracker = Tracker(config)
    runs = tracker.client.search_runs([tracker.experiment_id], f"tags.`drape.bench` = '{report['bench_id']}'")
    assert len(runs) == 1 and runs[0].data.metrics["reference.speedup"] == pytest.approx(1.0)
    assert "bf16.attention_cosine_min" in runs[0].data.metrics
    version = tracker.version_by_alias("denoise-baseline")
    assert version.tags["drape.inference.variant"] == report["recommended"]
    # Prometheus series of the bench, ready to push
    series = metrics.exposition({"bench": report["bench_id"]})
    assert 'drape_inference_latency_seconds{bench="' in series and 'variant="bf16"' in series


def test_the_flow_runs_the_bench_as_an_exclusive_queue_job(promoted, prefect_harness, tmp_path):
    config, _ = promoted
    from flows.inference_benchmark import inference_benchmark
    from scheduler.queue.store import JobStore

    queued = config.model_copy(
        update={
            "queue": config.queue.model_copy(update={"enabled": True, "dispatch_in_process": True, "poll_seconds": 0.2}),
            "inference": config.inference.model_copy(update={"repeat_reference": False}),
        }
    )
    path = tmp_path / "queued.yaml"
    path.write_text(json.dumps(queued.model_dump(mode="json", by_alias=True)))
    summary = inference_benchmark(config_path=str(path), inputs="control-00003", variants=["sdpa-efficient"])
    job = JobStore(queued.queue_url).get(summary["placement"]["job"])
    assert job["kind"] == "inference-benchmark" and job["state"] == "succeeded"
    assert job["mem_gib"] == queued.queue.cpu_slot_gib  # the whole device: nothing fits beside it
    report = json.loads((queued.paths.root_path / "live" / "inference" / summary["bench_id"] / "report.json").read_text())
    assert report["surroundings"]["exclusive"] is True and report["surroundings"]["queue_job"] == job["id"]
    assert [(row["name"], row["status"]) for row in report["rows"]] == [
        ("reference", "measured"),
        ("control", "measured"),
        ("sdpa-efficient", "skipped"),
    ]


@pytest.mark.gpu
def test_on_a_gpu_fp8_and_cudnn_attention_run_against_the_bf16_reference(promoted, tmp_path):
    """Where CUDA is (a lent H100/H200): the field's stack measures instead of being skipped."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    config, _ = promoted
    from drape.config.inference import DEFAULT_VARIANTS
    from drape.inference.bench import run_bench

    inference = config.inference.model_copy(update={"variants": list(DEFAULT_VARIANTS)})
    gpu = config.model_copy(update={"train": config.train.model_copy(update={"device": "cuda"}), "inference": inference})
    report = run_bench(gpu, inputs="control-00000,control-00001", only=["fp8", "sdpa-cudnn", "fp8+cudnn"])
    rows = {row["name"]: row for row in report.rows}
    assert rows["reference"]["spec"]["precision"] == "bf16"
    capability = torch.cuda.get_device_capability()
    for name in ("sdpa-cudnn", *(("fp8", "fp8+cudnn") if capability >= (8, 9) else ())):
        assert rows[name]["status"] == "measured", rows[name]["why"]
        assert rows[name]["peak_bytes"] > 0 and rows[name]["quality"]["attention_min"] > 0.9
