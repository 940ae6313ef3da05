"""`drape bench inference`: every variant an isolated run on the same stick, judged against the reference.

Order: the reference (twice, when `inference.repeat_reference`: the stick's own repeatability),
the control experiment (the noise floor), then each variant. Each runs in a fresh process
(`drape.inference.worker`), one after another, never two at once. The report (``report.json``,
``table.md`` in ``live/inference/<bench>/``) has per variant: latency median and p90 (denoise
only and end to end), speed-up over the reference, peak memory, overlap of concurrent requests,
density, quality figures and the verdict; the fastest approved variant is written as
``inference.json`` next to the model (what `drape tryon` then uses).

Also runnable as `python -m drape.inference.bench BENCH.json` (the queue's inference-benchmark job).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from drape.config import PipelineConfig, VariantSpec, parse_config
from drape.inference import quality as q
from drape.inference.report import BenchReport, variant_row
from drape.inference.source import captured_inputs, resolve_model
from drape.inference.variants import REFERENCE, reference_spec, resolved, unavailable
from drape.inference.worker import INPUT_FIELDS
from drape.jsonfile import read_json_object
from drape.layout import LiveLayout, live_root
from drape.secrets import redact

REPEAT = "reference-repeat"
INFERENCE_CONFIG = "inference.json"
Progress = Callable[[int, int, str], None]


def new_bench_id() -> str:
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


def plan(config: PipelineConfig, device: torch.device, only: list[str] | None = None) -> list[tuple[str, VariantSpec]]:
    """(role, resolved spec) of every isolated run, in order; `only` keeps the variants named."""
    reference = reference_spec(device)
    variants = config.inference.variants
    if only:
        unknown = sorted(set(only) - {v.name for v in variants})
        if unknown:
            raise ValueError(f"variants {unknown} are not in inference.variants ({', '.join(v.name for v in variants)})")
        variants = [v for v in variants if v.name in only]
    runs = [("reference", reference)]
    runs += [("repeat", reference.model_copy(update={"name": REPEAT}))] if config.inference.repeat_reference else []
    runs += [("control", resolved(config.inference.control, reference))]
    return runs + [("variant", resolved(v, reference)) for v in variants]


def _run_isolated(config: PipelineConfig, job: dict, directory: Path) -> dict:
    """One worker process; its result, or a failure naming the exit and the log's tail."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "result.json").unlink(missing_ok=True)
    job_file = directory / "job.json"
    job_file.write_text(json.dumps(job))
    log = directory / "worker.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        with open(log, "wb") as handle:
            code = subprocess.run(
                [sys.executable, "-m", "drape.inference.worker", str(job_file)],
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=config.inference.timeout_seconds,
                check=False,
            ).returncode
    except subprocess.TimeoutExpired:
        return {
            "status": "failed",
            "reason": f"no result within inference.timeout_seconds ({config.inference.timeout_seconds:.0f} s)",
        }
    result_file = directory / "result.json"
    if code != 0 or not result_file.is_file():
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        return {"status": "failed", "reason": f"worker exited {code}: {' | '.join(tail)[:400]}"}
    return read_json_object(result_file, "variant result")


def _floor(config: PipelineConfig, control: dict, directory: Path, results: dict[str, dict]) -> tuple[q.Quality, str]:
    """The noise floor's figures: the control experiment's, else the reference's repeat."""
    for name, source in ((config.inference.control.name, "control"), (REPEAT, "reference repeated")):
        if results.get(name, {}).get("status") == "measured":
            return q.measure_quality(config, control, directory / REFERENCE, directory / name), source
    return q.measure_quality(config, control, directory / REFERENCE, directory / REFERENCE), "reference against itself"


def _job(config: PipelineConfig, checkpoint: Path, directory: Path, role: str, spec: VariantSpec) -> dict:
    return {
        "config": config.model_dump(mode="json"),
        "checkpoint": str(checkpoint),
        "variant": spec.model_dump(),
        "role": role,
        "inputs": str(directory / "inputs.npz"),
        "out": str(directory / spec.name),
        "attention": role != "repeat",
    }


def _measure_all(config, runs, job_of, directory: Path, device, progress: Progress | None) -> dict[str, dict]:
    """Every run's result: each variant in turns with the reference (`inference.interleave`), or
    alone one after another. A variant the device cannot run starts no process."""
    from drape.inference.turns import Worker, WorkerError, take_turns

    results: dict[str, dict] = {}
    timeout = config.inference.timeout_seconds
    (role, spec), rest = runs[0], runs[1:]
    reference = Worker(job_of(role, spec), directory / spec.name, timeout) if config.inference.interleave else None
    try:
        hello = reference.receive() if reference is not None else {"ready": True}
        if not hello.get("ready"):
            raise RuntimeError(f"the reference cannot run here: {redact(hello.get('reason', ''))}")
        for index, (role, spec) in enumerate(rest, start=1):
            if progress:
                progress(index, len(runs), spec.name)
            head = {"role": role, "describe": spec.describe(), "spec": spec.model_dump()}
            if reason := unavailable(spec, device):
                results[spec.name] = {**head, "status": "skipped", "reason": reason}
                continue
            if reference is None:
                results[spec.name] = {**head, **_run_isolated(config, job_of(role, spec), directory / spec.name)}
                continue
            other = Worker(job_of(role, spec), directory / spec.name, timeout)
            try:
                result, paired = take_turns(reference, other, config.inference.runs)
                results[spec.name] = {**head, **result, **({"paired_reference": paired} if paired else {})}
            except WorkerError as error:
                results[spec.name] = {**head, "status": "failed", "reason": str(error)}
            finally:
                other.close()
        first = runs[0][1]
        results = {
            first.name: {
                "role": "reference",
                "describe": first.describe(),
                **(reference.finish() if reference else _run_isolated(config, job_of(*runs[0]), directory / first.name)),
            },
            **results,
        }
    finally:
        if reference is not None:
            reference.close()
    return results


def run_bench(
    config: PipelineConfig,
    *,
    model: str | None = None,
    inputs: str | None = None,
    only: list[str] | None = None,
    bench_id: str | None = None,
    progress: Progress | None = None,
) -> BenchReport:
    """Measure the reference, the control and every variant of `config.inference` on the captured inputs."""
    from drape.training.loop.trainer import resolve_device

    device = resolve_device(config.train.device)
    source = resolve_model(config, model)
    control, control_set = captured_inputs(config, inputs)
    bench_id = bench_id or new_bench_id()
    directory = LiveLayout(live_root(config)).inference(bench_id)
    directory.mkdir(parents=True, exist_ok=True)
    np.savez(directory / "inputs.npz", **{name: control[name] for name in INPUT_FIELDS})
    (directory / "keys.json").write_text(json.dumps(control["keys"]))
    runs = plan(config, device, only)

    def job_of(role: str, spec: VariantSpec) -> dict:
        return _job(config, source.checkpoint, directory, role, spec)

    results = _measure_all(config, runs, job_of, directory, device, progress)
    if progress:
        progress(len(runs), len(runs), "quality")
    if results[REFERENCE].get("status") != "measured":
        raise RuntimeError(f"the reference run failed, nothing to compare with: {redact(results[REFERENCE].get('reason', ''))}")
    return _report(config, source, control, control_set, bench_id, directory, results)


def _report(config, source, control, control_set, bench_id, directory, results) -> BenchReport:
    floor, floor_source = _floor(config, control, directory, results)
    limits = q.thresholds(floor, config.inference.quality)
    reference = results[REFERENCE]
    rows = []
    for name, result in results.items():
        quality, reasons = None, []
        if result.get("status") == "measured" and result["role"] != "repeat":
            quality = q.measure_quality(config, control, directory / REFERENCE, directory / name)
            reasons = q.verdict(quality, limits)
        rows.append(variant_row(name, result, reference, quality, reasons))
    report = BenchReport(
        bench_id=bench_id,
        model=source.label,
        model_version=source.version,
        checkpoint=str(source.checkpoint),
        home=str(source.home),
        control_set=control_set,
        inputs=len(control["keys"]),
        settings=config.inference.model_dump(mode="json", exclude={"variants", "control"}),
        surroundings=reference.get("surroundings", {}),
        floor_source=floor_source,
        floor=floor.to_dict(),
        thresholds=limits.to_dict(),
        rows=rows,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    report.write(directory)
    return report


def write_inference_config(report: BenchReport, home: Path) -> Path:
    """The recommended variant as ``inference.json`` next to the model (written whole, then renamed)."""
    row = report.recommended()
    payload = {
        "model": report.model,
        "model_version": report.model_version,
        "variant": row["spec"],
        "why": row["why"],
        "measured": {k: row.get(k) for k in ("denoise_median_s", "speedup", "peak_bytes", "peak_ratio")},
        "bench": report.bench_id,
        "device": report.surroundings.get("name"),
    }
    path = home / INFERENCE_CONFIG
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(payload, indent=2))
    temporary.replace(path)
    return path


def read_inference_config(home: Path) -> VariantSpec | None:
    """The recommended variant written next to a model, if any (an unreadable one is an error naming it)."""
    path = home / INFERENCE_CONFIG
    if not path.is_file():
        return None
    try:
        return VariantSpec.model_validate(read_json_object(path, "variant result")["variant"])
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not an inference config drape wrote ({str(error)[:200]})") from None


def main(argv: list[str] | None = None) -> int:
    """The queue job: BENCH.json holds config, model, inputs, variants and the bench id."""
    job = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    config = parse_config(job["config"], "inference-benchmark job")
    report = run_bench(
        config, model=job.get("model"), inputs=job.get("inputs"), only=job.get("variants"), bench_id=job["bench_id"]
    )
    print(report.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
