"""Scaling efficiency, measured: a short stage job at 1, 2, ... ranks under torchrun (gloo on CPU,
NCCL on GPUs), efficiency(N) = throughput(N) / (N × throughput(1)). Recorded per job shape in the
object store (``cost/scaling/<config>-<stage>.json``) for the cost report's "on N GPUs" lines.

Throughput is the training loop's (samples per second from the first step to the last), so the
start-up of N processes does not count against it; each point is the median of `repeats` runs.
On CPU every rank gets the same `threads` (OMP_NUM_THREADS, default 1) and needs that many cores:
N ranks stand for N devices of the 1-rank run's size, and what is lost is gloo's communication and
the ranks waiting on each other, as NCCL's would be on GPUs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from drape.config import PipelineConfig
from drape.jsonfile import parse_json_object, read_json_object
from drape.storage.store import ObjectStore


def scaling_key(config: PipelineConfig, stage: str = "identity") -> str:
    return f"cost/scaling/{config.name}-{stage}.json"


def read_scaling(store: ObjectStore, config: PipelineConfig, stage: str = "identity") -> dict | None:
    key = scaling_key(config, stage)
    return parse_json_object(store, key, "scaling record") if store.exists(key) else None


def efficiency(throughput: dict[int, float]) -> dict[int, float]:
    """throughput(N) / (N × throughput(1)) for each measured N (1 must be measured)."""
    if 1 not in throughput or throughput[1] <= 0:
        raise ValueError(f"scaling needs a measured 1-rank throughput, got {throughput}")
    return {ranks: value / (ranks * throughput[1]) for ranks, value in sorted(throughput.items())}


def _command(ranks: int, args: list[str]) -> list[str]:
    if ranks == 1:
        return [sys.executable, "-m", "drape.train", *args]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        "-m",
        "drape.train",
        *args,
    ]


def run_once(config: PipelineConfig, stage: str, ranks: int, steps: int, workdir: Path, timeout: float, threads: int = 1) -> dict:
    """One short stage job on `ranks` ranks; its result (samples per second, device, ...)."""
    data = config.model_dump(mode="json")
    data["train"]["stages"][stage]["steps"] = steps
    data["train"]["checkpoint_every"] = steps
    data["train"]["gpus"] = ranks
    data["train"]["stages"][stage]["gpus"] = None
    data["metrics"]["pushgateway_url"] = None
    path, out, result = workdir / f"scaling-{ranks}.yaml", workdir / f"out-{ranks}", workdir / f"result-{ranks}.json"
    path.write_text(yaml.safe_dump(data))
    args = ["--config", str(path), "--stage", stage, "--out", str(out), "--result", str(result)]
    try:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run(_command(ranks, args), capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"scaling: the {ranks}-rank job of {stage} ran over {timeout:.0f} s") from None
    if done.returncode != 0 or not result.is_file():
        raise RuntimeError(f"scaling: the {ranks}-rank job of {stage} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return read_json_object(result, "scaling result")


def measure(
    config: PipelineConfig,
    store: ObjectStore,
    *,
    stage: str = "identity",
    ranks: tuple[int, ...] = (1, 2),
    steps: int = 30,
    repeats: int = 1,
    timeout: float = 900.0,
    threads: int = 1,
    on_point=None,
) -> dict:
    """Measure and record the shape's scaling (see the module docstring); returns the record."""
    throughput: dict[int, float] = {}
    device = ""
    for count in sorted(set(ranks) | {1}):
        if config.train.batch_size % count:
            raise ValueError(f"train.batch_size {config.train.batch_size} does not split over {count} ranks")
        values = []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory(prefix="drape-scaling-") as workdir:
                result = run_once(config, stage, count, steps, Path(workdir), timeout, threads)
            loop = result["train_seconds"] - result.get("checkpoint_stall_seconds", 0.0)  # steps only, not the save
            values.append(result["samples_per_second"] * result["train_seconds"] / max(loop, 1e-9))
            device = result.get("device") or device
        throughput[count] = statistics.median(values)
        if on_point:
            on_point(count, throughput[count])
    record = {
        "config": config.name,
        "stage": stage,
        "steps": steps,
        "repeats": repeats,
        "threads_per_rank": threads,
        "device": device,
        "throughput": {str(k): v for k, v in throughput.items()},
        "efficiency": {str(k): v for k, v in efficiency(throughput).items()},
        "recorded_at": time.time(),
    }
    store.put_bytes(json.dumps(record, sort_keys=True).encode(), scaling_key(config, stage))
    return record
