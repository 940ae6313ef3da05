"""An inference benchmark (`drape.inference.bench`) as a queue job: one whole GPU and nothing
beside it, run and waited for."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from drape import JobKind
from drape.layout import LiveLayout, live_root
from drape.mounts import job_paths, model_paths
from scheduler.queue.store import JobSpec

if TYPE_CHECKING:
    from drape.inference.report import BenchReport


def inference_job_spec(config, *, bench_id: str, command: list[str]) -> JobSpec:
    """An inference-benchmark job: one whole GPU and nothing beside it. It asks for all of the
    biggest GPU's memory (`inference.gpu_memory_gib`, at most what the fleet's biggest GPU has), so
    the policy can only place it on an idle GPU and can put nothing next to it while it runs."""
    from scheduler.dispatch.fleet import fleet_view
    from scheduler.queue.store import JobStore

    view = fleet_view(config, JobStore(config.queue_url))
    biggest = max((gpu.total_gib for gpu in view.gpus), default=config.inference.gpu_memory_gib)
    return JobSpec(
        kind=JobKind.INFERENCE_BENCHMARK,
        command=command,
        gpus=1,
        mem_gib=min(config.inference.gpu_memory_gib, biggest),
        duration_s=config.inference.timeout_seconds,
        priority=4,
        env={"DRAPE_INFERENCE_EXCLUSIVE": "1"},
        labels={"bench": bench_id, "mounts": json.dumps(job_paths(config)), "models": json.dumps(model_paths(config))},
    )


def run_inference_benchmark(
    config, *, bench_id: str, model: str | None, inputs: str | None, variants: list[str], on_line=None
) -> tuple[dict, BenchReport]:
    """`drape.inference.bench` as a queue job (its BENCH.json in the bench's folder), waited for;
    returns (the job row, the BenchReport it wrote)."""
    import sys

    from drape.inference.report import BenchReport
    from scheduler.dispatch.dispatcher import submit_and_wait

    directory = LiveLayout(live_root(config)).inference(bench_id)
    directory.mkdir(parents=True, exist_ok=True)
    job = {"config": config.model_dump(mode="json"), "model": model, "inputs": inputs, "variants": variants, "bench_id": bench_id}
    path = directory / "bench-job.json"
    path.write_text(json.dumps(job))
    command = [sys.executable, "-m", "drape.inference.bench", str(path)]
    spec = inference_job_spec(config, bench_id=bench_id, command=command)
    bound = config.inference.timeout_seconds * (len(config.inference.variants) + 3)
    row = submit_and_wait(config, spec, on_line=on_line, timeout_s=bound)
    return row, BenchReport.read(directory / "report.json")
