"""The `inference-benchmark` flow: the measuring stick on a promoted model, as a queue job of kind
inference-benchmark (a whole idle GPU) when the config's queue is on; its table is a Prefect artifact."""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from drape.config import default_config_path, load_config
from tasks import inference as t


@flow(name="inference-benchmark", log_prints=True)
def inference_benchmark(
    config_path: str = str(default_config_path()),
    model: str | None = None,
    inputs: str | None = None,
    variants: list[str] | None = None,
) -> dict:
    from drape.inference.bench import new_bench_id

    config = load_config(config_path)
    result = t.bench_inference(config, model, inputs, list(variants or []), new_bench_id())
    report, placement = result["report"], result["placement"]
    where = f"queue job {placement['job']} on {placement['assigned']}" if placement else "in the flow's process"
    markdown = result["markdown"] + f"\n\nRan {where}; MLflow run `{result['mlflow_run']}`."
    create_markdown_artifact(markdown, key="inference-benchmark", description=f"inference benchmark of {report['model']}")
    print(f"inference-benchmark {report['bench_id']}: recommended {report['recommended']} ({where})")
    return {
        "bench_id": report["bench_id"],
        "recommended": report["recommended"],
        "placement": placement,
        "inference_config": result["inference_config"],
    }
