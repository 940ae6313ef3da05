"""Where a benchmark's results go: the recommended variant next to the model, an MLflow run (and a
tag on the model version), Prometheus series (Pushgateway, grouped by bench)."""

from __future__ import annotations

import re
from pathlib import Path

from drape.config import PipelineConfig
from drape.inference.bench import write_inference_config
from drape.inference.report import BenchReport
from drape.ops import metrics


def _key(name: str) -> str:
    """A variant's name as MLflow allows in a param or metric key ('fp8+cudnn' → 'fp8_cudnn')."""
    return re.sub(r"[^\w\-. :/]", "_", name)


def set_series(report: BenchReport) -> dict[str, str]:
    """Fill the drape_inference_* gauges for every measured row; returns the grouping labels."""
    for row in report.rows:
        if row["status"] != "measured":
            continue
        labels = {"bench": report.bench_id, "model": report.model, "variant": row["name"]}
        for scope, key in (("denoise", "denoise"), ("end_to_end", "total")):
            metrics.INFERENCE_LATENCY.labels(**labels, scope=scope, quantile="0.5").set(row[f"{key}_median_s"])
            metrics.INFERENCE_LATENCY.labels(**labels, scope=scope, quantile="0.9").set(row[f"{key}_p90_s"])
        metrics.INFERENCE_SPEEDUP.labels(**labels).set(row["speedup"])
        if row["peak_bytes"] is not None:
            metrics.INFERENCE_PEAK_MEMORY.labels(**labels).set(row["peak_bytes"])
        attention = (row.get("quality") or {}).get("attention_min")
        if attention is not None:
            metrics.INFERENCE_ATTENTION_COSINE.labels(**labels).set(attention)
        for count, value in row["overlap"].items():
            metrics.INFERENCE_OVERLAP.labels(**labels, concurrency=count).set(value)
        if row["approved"] is not None:
            metrics.INFERENCE_APPROVED.labels(**labels).set(1.0 if row["approved"] else 0.0)
    return {"bench": report.bench_id}


def log_run(config: PipelineConfig, report: BenchReport, directory: Path, inference_config: Path) -> str:
    """An MLflow run with the settings, each variant's figures and the report; the model version
    (when the model came from the registry) is tagged with the recommended variant."""
    from drape.ops.tracking import Tracker

    tracker = Tracker(config)
    tags = {"drape.kind": "inference-benchmark", "drape.bench": report.bench_id, "drape.model": report.model}
    run_id = tracker.start_run(f"inference-benchmark {report.bench_id}", tags)
    params = {f"inference.{k}": v for k, v in report.settings.items() if k != "quality"}
    params.update({"device": report.surroundings.get("name", "?"), "floor": report.floor_source, "inputs": report.inputs})
    params.update({f"variant.{_key(r['name'])}": r["describe"] for r in report.rows})
    tracker.log_params(run_id, params)
    figures: dict[str, float] = {}
    for row in report.rows:
        if row["status"] != "measured":
            continue
        for key in ("denoise_median_s", "denoise_p90_s", "total_median_s", "total_p90_s", "speedup", "peak_bytes"):
            if row.get(key) is not None:
                figures[f"{_key(row['name'])}.{key}"] = row[key]
        attention = (row.get("quality") or {}).get("attention_min")
        if attention is not None:
            figures[f"{_key(row['name'])}.attention_cosine_min"] = attention
        if row["approved"] is not None:
            figures[f"{_key(row['name'])}.approved"] = float(row["approved"])
    tracker.log_metrics(run_id, figures)
    for name in ("report.json", "table.md"):
        tracker.log_artifact(run_id, directory / name, "inference")
    tracker.log_artifact(run_id, inference_config, "inference")
    if report.model_version:
        recommended = report.recommended()
        tracker.set_version_tags(
            report.model_version, {"drape.inference.variant": recommended["name"], "drape.inference.bench": report.bench_id}
        )
    tracker.end_run(run_id)
    return run_id


def publish(config: PipelineConfig, report: BenchReport, directory: Path, home: Path) -> dict:
    """Write the inference config next to the model, log the MLflow run, push the series."""
    inference_config = write_inference_config(report, home)
    run_id = log_run(config, report, directory, inference_config)
    pushed = metrics.push_metrics(config, grouping=set_series(report))
    return {"inference_config": str(inference_config), "mlflow_run": run_id, "pushed": pushed}
