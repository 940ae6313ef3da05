"""What a run records of its own time, for its cost: one small JSON object per event under
``runs/<run>/cost/`` in the object store (the durable place a resumed run's other attempts find).

- ``open-<ns>`` / ``close-<ns>``: the run (re)started, and ended with a status; a run resumed after
  a kill has several open/close segments, and the dead time between them is not the run's.
- ``<stage>-<step>-<ns>``: a timed step (prestage, gate, snapshot, archive) with its start and end
  and what it moved (bytes downloaded, archived, live before and after).
- ``<stage>-train-<ns>``: the training loop of a stage job as the job measured it: when its first
  step began, the loop's seconds, the GPU-seconds ranks waited for data, the checkpoint stall, the
  device; an in-process job (no queue) also its whole window.
"""

from __future__ import annotations

import json
import sys
import time

from drape.jsonfile import parse_json_object
from drape.layout import run_key
from drape.storage.store import ObjectStore

PREFIX = "cost"


def _key(run_id: str, name: str) -> str:
    return run_key(run_id, relative=f"{PREFIX}/{name}-{time.time_ns()}.json")


def record(store: ObjectStore, run_id: str, name: str, payload: dict) -> None:
    """Write one record; a store that refuses it is reported and the run goes on (its cost report
    then misses this piece: the step it times still counts, in "between stages")."""
    try:
        store.put_bytes(json.dumps(payload, sort_keys=True).encode(), _key(run_id, name))
    except Exception as error:  # noqa: BLE001 - accounting never stops a run
        print(f"drape: run {run_id}: cost record {name} not written ({type(error).__name__}: {error})", file=sys.stderr)


def record_open(store: ObjectStore, run_id: str, at: float | None = None) -> None:
    record(store, run_id, "open", {"event": "open", "at": time.time() if at is None else at})


def record_close(store: ObjectStore, run_id: str, status: str, at: float | None = None) -> None:
    record(store, run_id, "close", {"event": "close", "status": status, "at": time.time() if at is None else at})


def record_step(store: ObjectStore, run_id: str, stage: str, step: str, start: float, end: float, **extra) -> None:
    record(store, run_id, f"{stage}-{step}", {"event": "step", "stage": stage, "step": step, "start": start, "end": end, **extra})


def record_train(store: ObjectStore, run_id: str, job, window: tuple[float, float] | None = None) -> None:
    """A stage job's loop (`job`: a StageJobResult); `window`: the job's own start and end when it ran
    in the pipeline's process (a queue job's window is its allocation, from the queue)."""
    train = job.train
    payload = {
        "event": "train",
        "stage": train.stage,
        "step": "train",
        "loop_started_at": train.loop_started_at,
        "train_seconds": train.train_seconds,
        "world_size": job.world_size,
        "data_wait_gpu_seconds": sum(r.get("data_wait_seconds", 0.0) for r in train.ranks) or train.data_wait_seconds,
        "checkpoint_stall_seconds": train.checkpoint_stall_seconds,
        "device": train.device,
        "steps_trained": train.steps - train.resumed_from_step,
        "samples_per_second": train.samples_per_second,
        "window": list(window) if window else None,
    }
    record(store, run_id, f"{train.stage}-train", payload)


def read(store: ObjectStore, run_id: str) -> list[dict]:
    """Every event the run recorded, oldest first; an unreadable one is an error naming it."""
    events = []
    for key in store.list(run_key(run_id, relative=PREFIX)):
        try:
            events.append(parse_json_object(store, key, "event"))
        except ValueError as error:
            raise ValueError(f"{store.key_url(key)}: not a JSON cost record ({error})") from None
    return sorted(events, key=lambda e: e.get("at", e.get("start", e.get("loop_started_at", 0.0))))
