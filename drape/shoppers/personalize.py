"""Enrol a shopper and train, gate and keep (or drop) their adapter.

`enroll` copies the photos into ``live/shoppers/<id>/`` (and the object store under
``shoppers/<id>/``, tagged for the consent's lifetime) and writes the ledger. `personalize` is
the job: it fits the adapter on the training photos, judges it with the personalization gate on
the held-out ones, keeps it (uploaded, an MLflow run in the ``drape-shoppers`` experiment) or
removes it, and writes ``report.json`` with the gate's values, the adapter's size, the job's
time, peak memory and cost. As a queue job: ``python -m drape.shoppers.personalize JOB.json``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from drape.config import PipelineConfig, parse_config
from drape.inference.source import ResolvedModel, config_control, resolve_model
from drape.layout import LiveLayout, ShopperPaths, live_root, safe_shopper_id, shopper_prefix
from drape.shoppers import ShopperError, adapter, gate
from drape.shoppers.ledger import Ledger, read_ledger, require_ledger, write_ledger
from drape.shoppers.photos import copy_photos, digests, load_photos, split_holdout
from drape.shoppers.report import build_report
from drape.storage.checksum import sha256_file
from drape.storage.durable import publish_json
from drape.storage.store import ObjectStore, open_store

TAGS = {"drape-kind": "shopper"}  # the bucket's shopper rule expires them after the consent (drape.storage.lifecycle)
EXPERIMENT = "drape-shoppers"


def shopper_paths(config: PipelineConfig, shopper: str) -> ShopperPaths:
    return LiveLayout(live_root(config)).shopper(safe_shopper_id(shopper))


def upload(store: ObjectStore, paths: ShopperPaths, *names: str) -> list[str]:
    """Mirror files or folders of the shopper's live directory under their prefix, each verified."""
    keys = []
    for name in names:
        local = paths.root / name
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for file in files:
            key = shopper_prefix(paths.root.name) + file.relative_to(paths.root).as_posix()
            store.put_file(file, key, tags=TAGS)
            keys.append(key)
    return keys


def enroll(
    config: PipelineConfig, shopper: str, photos: Path, *, holdout: Path | None = None, consent_days: int | None = None
) -> Ledger:
    """Check and copy the shopper's photos (and held-out photos) in, write the ledger, mirror both."""
    shoppers, paths = config.shoppers, shopper_paths(config, shopper)
    count = len(load_photos(photos, "--photos")["keys"])
    held = len(load_photos(holdout, "--holdout")["keys"]) if holdout else shoppers.holdout
    training = count if holdout else count - held
    if training < 2 or count + (held if holdout else 0) < shoppers.min_photos:
        raise ShopperError(
            f"--photos {photos}: {count} photos; expected at least {shoppers.min_photos} in all, "
            f"{held} of them held out for the gate and 2 or more to train on"
        )
    ledger = read_ledger(paths) or Ledger.new(shopper, consent_days or shoppers.consent_days)
    copy_photos(photos, paths.photos)
    if holdout:
        copy_photos(holdout, paths.holdout)
    else:
        shutil.rmtree(paths.holdout, ignore_errors=True)
    found = digests(paths.photos)
    found.update(digests(paths.holdout))
    ledger.photos = found.to_dict()
    write_ledger(paths, ledger)
    upload(open_store(config), paths, "photos", "holdout", "shopper.json")
    return ledger


def _photo_sets(config: PipelineConfig, paths: ShopperPaths) -> tuple[dict, dict]:
    photos = load_photos(paths.photos, f"shopper {paths.root.name}'s photos")
    if paths.holdout.is_dir():
        return photos, load_photos(paths.holdout, f"shopper {paths.root.name}'s held-out photos")
    return split_holdout(photos, config.shoppers.holdout)


def _fit_and_judge(config: PipelineConfig, paths: ShopperPaths, source: ResolvedModel, progress) -> tuple[dict, adapter.Fit]:
    from drape.training.loop.trainer import resolve_device

    device = resolve_device(config.train.device)
    training, holdout = _photo_sets(config, paths)
    fitted = adapter.fit(config, source.checkpoint, training, progress=progress)
    candidate = paths.root / ".adapter-candidate"
    shutil.rmtree(candidate, ignore_errors=True)
    adapter.save(candidate, fitted, {"shopper_adapter": True, "base": source.label, "photos": len(training["keys"])})
    base = adapter.load_base(config, source.checkpoint).to(device).eval()  # type: ignore[arg-type]
    control, _ = config_control(config)
    verdict = gate.judge(config, base, adapter.merged(fitted), holdout, control)
    verdict["training_photos"] = len(training["keys"])
    return verdict, fitted


def personalize(
    config: PipelineConfig, shopper: str, *, base: str | None = None, progress: Callable[[int, int], None] | None = None
) -> dict:
    """Fit, gate and keep or drop the shopper's adapter; returns (and writes) the report."""
    from drape.training.loop.trainer import device_name, peak_memory_gib, resolve_device

    started, paths = time.perf_counter(), shopper_paths(config, shopper)
    ledger = require_ledger(paths)
    source = resolve_model(config, base)
    verdict, fitted = _fit_and_judge(config, paths, source, progress)
    candidate = paths.root / ".adapter-candidate"
    if verdict["passed"]:
        shutil.rmtree(paths.adapter, ignore_errors=True)
        candidate.rename(paths.adapter)
    else:
        shutil.rmtree(candidate)  # a failed adapter is not kept; an earlier one that passed stays
    device = resolve_device(config.train.device)
    job = {
        "seconds": time.perf_counter() - started,
        "train_seconds": fitted.seconds,
        "steps": config.shoppers.steps,
        "device": device_name(device),  # the GPU model (priced by cost.gpu_prices), or 'cpu'
        "peak_memory_gib": peak_memory_gib(device),
    }
    report = build_report(config, paths, ledger, source, verdict, job, fitted)
    _record(config, paths, ledger, report)
    return report


def _record(config: PipelineConfig, paths: ShopperPaths, ledger: Ledger, report: dict) -> None:
    """The MLflow run (tagged with the shopper, so forget finds it), the uploads, the ledger."""
    from drape.ops.tracking import Tracker

    tracker = Tracker(config, experiment=EXPERIMENT)
    run = tracker.start_run(f"personalize-{ledger.shopper}", tags={"drape.shopper": ledger.shopper})
    ledger.remember("mlflow_runs", run)
    write_ledger(paths, ledger)  # before anything else names the run: a forget must find it
    identity, garments = report["gate"]["identity"], report["gate"]["garments"]
    tracker.log_params(run, {"steps": config.shoppers.steps, "rank": config.shoppers.rank, "base": report["base"]["model"]})
    metrics = {"identity_base": identity["base"], "identity_adapter": identity["adapter"], "identity_gain": identity["gain"]}
    metrics |= {f"{check}_drop": values["drop"] for check, values in garments.items()}
    metrics |= {"job_seconds": report["job"]["seconds"], "adapter_bytes": report["adapter"]["bytes"]}
    tracker.log_metrics(run, metrics)
    publish_json(paths.report, report)
    tracker.log_artifact(run, paths.report)
    store = open_store(config)
    if report["status"] == "kept":
        tracker.log_artifacts(run, paths.adapter, "adapter")
        ledger.adapter = {
            "base": report["base"],
            "bytes": report["adapter"]["bytes"],
            "manifest_sha256": sha256_file(paths.adapter / "manifest.json"),
        }
        upload(store, paths, "adapter")
    tracker.end_run(run, "FINISHED" if report["status"] == "kept" else "FAILED")
    write_ledger(paths, ledger)
    upload(store, paths, "report.json", "shopper.json")


def main(argv: list[str] | None = None) -> int:
    """``python -m drape.shoppers.personalize JOB.json``: the queue job. Exit 0 when the report is
    written, the adapter kept or rejected alike (the gate decided: the report says which)."""
    args = argv if argv is not None else sys.argv[1:]
    job = json.loads(Path(args[0]).read_text())
    config = parse_config(job["config"], args[0])

    def progress(step: int, total: int) -> None:
        if step == total or step % max(1, total // 10) == 0:
            print(f"personalize: step {step}/{total}", flush=True)

    report = personalize(config, job["shopper"], base=job.get("base"), progress=progress)
    print(f"personalize: adapter {report['status']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
