"""Prefect task around the inference measuring stick: in this process, or as a queue job on a whole idle GPU."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from drape.config import PipelineConfig


@task(name="bench-inference", cache_policy=NONE, log_prints=True, timeout_seconds=24 * 3600)
def bench_inference(config: PipelineConfig, model: str | None, inputs: str | None, variants: list[str], bench_id: str) -> dict:
    """Measure (`drape.inference.bench`, through the queue when `queue.enabled`) and publish; returns
    the report, its Markdown and where it went."""
    from drape.inference.bench import run_bench
    from drape.inference.publish import publish
    from drape.layout import LiveLayout, live_root

    directory = LiveLayout(live_root(config)).inference(bench_id)
    placement = None
    if config.queue.enabled:
        from scheduler.jobs.inference import run_inference_benchmark

        row, report = run_inference_benchmark(
            config, bench_id=bench_id, model=model, inputs=inputs, variants=variants, on_line=print
        )
        placement = {"job": row["id"], "assigned": row["assigned"], "mem_gib": row["mem_gib"]}
    else:
        report = run_bench(config, model=model, inputs=inputs, only=variants or None, bench_id=bench_id)
    published = publish(config, report, directory, Path(report.home))
    return {"report": report.to_dict(), "markdown": report.markdown(), "placement": placement, **published}
