"""One variant's isolated run: `python -m drape.inference.worker JOB.json` (a fresh process per
variant, so no compile cache, allocator state or hook of another variant is in the room).

JOB.json (written by `drape.inference.bench`): the config, the checkpoint, the variant and the
reference, the captured inputs (``inputs.npz``) and the output folder, where it writes
``outputs.npy`` (the variant's render of each input), ``attention.safetensors`` (each attention
block's output on the first inputs) and, last, ``result.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
from safetensors.torch import save_file

from drape.config import PipelineConfig, VariantSpec, parse_config
from drape.inference import stick
from drape.inference.variants import prepare, unavailable

INPUT_FIELDS = ("target", "agnostic", "mask", "pose", "garment")


def _meminfo_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def surroundings(device: torch.device) -> dict:
    """What else was on the device as the run began (the report shows it: an idle device or not)."""
    facts: dict = {"device": device.type, "queue_job": os.environ.get("DRAPE_JOB_ID"), "pid": os.getpid()}
    facts["exclusive"] = os.environ.get("DRAPE_INFERENCE_EXCLUSIVE") == "1"
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        facts.update(name=torch.cuda.get_device_name(device), total_bytes=total, others_bytes=total - free)
        facts["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    else:
        facts.update(name="cpu", cores=os.cpu_count(), load_1m=round(os.getloadavg()[0], 2), threads=torch.get_num_threads())
        facts["total_bytes"] = _meminfo_bytes("MemAvailable")
    return facts


def _resident(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return stick._status_kib("VmRSS") * 1024


def _density(facts: dict, resident: int, peaks: list[int] | None, device: torch.device) -> int | None:
    """Requests that fit in the device's memory by the measured per-request peak."""
    if not peaks or not facts.get("total_bytes"):
        return None
    per_request = statistics.median(peaks) - (resident if device.type == "cuda" else 0)
    room = facts["total_bytes"] - (facts.get("others_bytes", 0) + resident if device.type == "cuda" else 0)
    return int(room // per_request) if per_request > 0 else None


def load_requests(path: Path, device: torch.device, dtype: torch.dtype) -> list[dict]:
    """The captured inputs as batch-1 requests of model inputs on `device` in `dtype`."""
    from drape.data.dataset import to_model_inputs

    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in INPUT_FIELDS}
    inputs = to_model_inputs(arrays)
    count = next(iter(inputs.values())).shape[0]
    return [{k: v[i : i + 1].to(device=device, dtype=dtype) for k, v in inputs.items()} for i in range(count)]


@dataclass
class Setup:
    config: PipelineConfig
    device: torch.device
    session: stick.Session
    base: dict


def setup(job: dict) -> Setup | dict:
    """The loaded, prepared and warmed variant; or, when the device cannot run it, the result that
    says why."""
    config: PipelineConfig = parse_config(job["config"], "inference job")
    spec = VariantSpec.model_validate(job["variant"])
    from drape.training.checkpoints.checkpoint import load_model
    from drape.training.loop.trainer import resolve_device
    from drape.training.recipes.model import configured_class_path

    device = resolve_device(config.train.device)
    base: dict = {"variant": spec.name, "spec": spec.model_dump(), "describe": spec.describe(), "role": job["role"]}
    base["surroundings"] = surroundings(device)
    if reason := unavailable(spec, device):
        return {**base, "status": "skipped", "reason": reason}
    model = load_model(job["checkpoint"], prefer_ema=True, allowed=(configured_class_path(config),))
    prepared = prepare(model, spec, device, config.diffusion.sampling_steps)
    requests = load_requests(Path(job["inputs"]), device, prepared.dtype)
    session = stick.Session(prepared, config.diffusion, requests, config.inference.seed)
    session.warm(config.inference.warmup)
    return Setup(config, device, session, base)


def finish(job: dict, ready: Setup, started: float) -> dict:
    """After the timed requests: outputs, attention, concurrency and, last, peak memory (see stick)."""
    config, device, session = ready.config, ready.device, ready.session
    settings, prepared, requests, seed = config.inference, session.prepared, session.requests, session.seed
    out = Path(job["out"])
    np.save(out / "outputs.npy", session.outputs(), allow_pickle=False)
    resident = _resident(device)
    if job.get("attention", True):
        first = requests[: settings.quality.attention_inputs]
        captured = stick.attention_outputs(prepared, config.diffusion, first, seed, settings.quality.attention_timestep_fraction)
        save_file(captured, str(out / "attention.safetensors"))
    together: dict = {}
    if prepared.stateful is not None:
        together = {"skipped": "a cache hook's state belongs to one request at a time"}
    elif settings.concurrency:
        counts, repeats = settings.concurrency, settings.concurrency_runs
        together = {str(n): s for n, s in stick.concurrency(prepared, config.diffusion, requests, counts, repeats, seed).items()}
    peaks = stick.peaks(prepared, config.diffusion, requests, settings.memory_requests, seed)  # last: see stick
    return {
        **ready.base,
        "status": "measured",
        "steps": prepared.steps,
        **session.timings,
        "peak_bytes": peaks,
        "resident_bytes": resident,
        "density": _density(ready.base["surroundings"], resident, peaks, device),
        "together_s": together,
        "seconds": time.perf_counter() - started,
    }


def run(job: dict) -> dict:
    """Measure one variant alone: warm-up, at least `inference.runs` timed requests, then the rest."""
    started = time.perf_counter()
    ready = setup(job)
    if isinstance(ready, dict):
        return ready
    ready.session.timed(max(ready.config.inference.runs, len(ready.session.requests)))
    return finish(job, ready, started)


def serve(job: dict, commands: TextIO, replies: TextIO) -> dict:
    """Take turns: after the warm-up, answer {"run": n} with the timings of n requests, {"finish": true}
    with the result (also written to result.json by `main`). Replies are one JSON line each."""

    def reply(message: dict) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    started = time.perf_counter()
    ready = setup(job)
    if isinstance(ready, dict):
        reply(ready)
        return ready
    reply({"ready": True})
    for line in commands:
        command = json.loads(line)
        if "run" in command:
            reply(ready.session.timed(int(command["run"])))
        elif command.get("finish"):
            result = finish(job, ready, started)
            reply({"done": True})
            return result
    raise RuntimeError("the benchmark closed the turn-taking pipe before asking the worker to finish")


def main(argv: list[str] | None = None) -> int:
    """`JOB.json` alone: one run; `JOB.json --serve`: take turns over stdin/stdout (see `serve`)."""
    args = argv if argv is not None else sys.argv[1:]
    job = json.loads(Path(args[0]).read_text())
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    replies = None
    if "--serve" in args:  # the protocol keeps stdout; anything else printed goes to stderr (the log)
        replies = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
    try:
        result = serve(job, sys.stdin, replies) if replies else run(job)
    except Exception as error:  # noqa: BLE001 - a variant that breaks is reported as failed, with the reason
        result = {
            "variant": job["variant"]["name"],
            "role": job["role"],
            "status": "failed",
            "reason": f"{type(error).__name__}: {error}",
        }
        if replies:
            replies.write(json.dumps(result) + "\n")
            replies.flush()
    temporary = out / ".result.json.tmp"
    temporary.write_text(json.dumps(result))
    temporary.replace(out / "result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
