"""The GPU queue: memory profiles, fleet view, placement policy, durable queue, dispatcher,
launchers and the trace simulator. Imports run `tasks → scheduler → drape`.

    policy.py      placement policies (drape, fifo-exclusive), shared by dispatcher and simulator
    store.py       the durable queue (SQLite / PostgreSQL): jobs, ledger, measurements
    leases.py      dispatcher leases: renewal, adoption and requeue of expired ones (compare-and-set)
    profiles.py    memory profiles: estimated from the config, learned from measured peaks
    fleet.py       GPUs from DCGM via Prometheus, a static inventory, or this machine
    dispatcher.py  claim and launch; `submit_and_wait` for the pipeline's train task
    engine.py      the one shape of an engine (launch, poll, cancel, sees) and the choice by queue.launcher
    local.py       the local engine: processes (torchrun for multi-GPU stage jobs), queue.node_commands
    kubernetes.py  Kubernetes Jobs, indexed Jobs, PyTorchJobs: objects and launcher
    kubernetes_pods.py  their pods: credentials Secret, CPU/memory per GPU held, /dev/shm, mounts, placement
    slurm.py       the Slurm engine: sbatch scripts (srun torchrun on every node), requeue, adoption, sacct
    slurm_render.py  a config's sbatch script without a cluster (`drape queue sbatch`)
    prefect_runs.py  the Prefect engine: a flow run of a deployment
    gangs.py       jobs wider than a node on whole idle nodes (engines that span nodes)
    simulator.py   trace replay with the contention model
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from drape import JobKind, job_kind_for
from drape.layout import LiveLayout, job_paths, live_root, model_paths
from scheduler.store import JobSpec

if TYPE_CHECKING:
    from drape.inference.report import BenchReport


def train_job_spec(config, *, stage: str, mode: str, run_id: str, command: list[str]) -> JobSpec:
    """A stage-training (or fine-tune) job for the queue: `train.gpus` (or the stage's own) GPUs, each
    sized by the stage's memory profile; the launcher runs more than one under torchrun."""
    from scheduler.profiles import profile
    from scheduler.store import JobStore

    kind = job_kind_for(mode)
    gpus = config.train.gpus_for(stage)
    sized = profile(config, JobStore(config.queue_url), kind, stage, gpus)
    return JobSpec(
        kind=kind,
        command=command,
        gpus=gpus,
        mem_gib=sized.mem_gib,
        duration_s=sized.duration_s,
        stage=stage,
        shape=sized.shape,
        priority=5 if kind is JobKind.STAGE_TRAINING else 4,
        # ranks under torchrun, one per GPU; pods mount the paths the job's config writes to
        labels={
            "run": run_id,
            "launch": "torchrun",
            "mounts": json.dumps(job_paths(config)),
            "models": json.dumps(model_paths(config)),  # read-only: the VAE, the identity embedder
        },
    )


def inference_job_spec(config, *, bench_id: str, command: list[str]) -> JobSpec:
    """An inference-benchmark job: one whole GPU and nothing beside it. It asks for all of the
    biggest GPU's memory (`inference.gpu_memory_gib`, at most what the fleet's biggest GPU has), so
    the policy can only place it on an idle GPU and can put nothing next to it while it runs."""
    from scheduler.fleet import fleet_view
    from scheduler.store import JobStore

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
    from scheduler.dispatcher import submit_and_wait

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
