"""Resuming a run that died: what a run recorded of itself, and where each stage had got to.

A run writes its context to the object store when it starts (``runs/<run>/run.json``) and, for
each stage, how far the stage got (``runs/<run>/<stage>/progress.json``): ``gated`` once its
gate passed (the summary's row so far and the candidate checkpoint), ``snapshotted`` once it
is the baseline, ``done`` once archived. The object store is the durable place: a flow whose pod
was evicted or whose node was lost resumes on another node from it.

Resuming (`drape run --resume RUN_ID`, the flow's `resume` parameter, or a Prefect retry of the
same flow run) reopens the run's MLflow runs and then, stage by stage: a ``done`` stage is not
touched; a ``snapshotted`` one is archived; a ``gated`` one is snapshotted (idempotent: a
baseline this run already registered is not registered again) and archived; any other stage
trains from its newest checkpoint (live, else the newest one archived for this run: a node lost,
or a stage aborted before the run was resumed), is gated, and so on. A resumed run ends with the
weights of an uninterrupted one: training resumes exactly (drape/training/loop/batches.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, fields
from pathlib import Path

from drape import STAGES
from drape.jsonfile import parse_json_object
from drape.layout import run_key
from drape.storage.handoff import HandoffError, fetch_checkpoint, newest_published
from drape.storage.store import ObjectStore

PHASES = ("gated", "snapshotted", "done")


class ResumeError(RuntimeError):
    """A run that cannot be resumed: not found, another config or dataset, or already closed."""


def run_record_key(run_id: str) -> str:
    return run_key(run_id, relative="run.json")


def flow_run_key(flow_run_id: str) -> str:
    """Which drape run a Prefect flow run started (its retries resume that run)."""
    return f"flow-runs/{flow_run_id}.json"


def progress_key(run_id: str, stage: str) -> str:
    return run_key(run_id, stage, "progress.json")


def _read_json(store: ObjectStore, key: str) -> dict | None:
    if not store.exists(key):
        return None
    try:
        return parse_json_object(store, key, "run record")
    except ValueError as error:
        raise ResumeError(f"{store.key_url(key)} is not JSON ({error}); the run's record is damaged") from None


def save_context(store: ObjectStore, context, config_name: str, flow_run_id: str | None) -> None:
    """The run's context (and which flow run started it), for `load_context`."""
    record = {**asdict(context), "config_name": config_name, "closed": None}
    store.put_bytes(json.dumps(record, sort_keys=True).encode(), run_record_key(context.run_id))
    if flow_run_id:
        store.put_bytes(json.dumps({"run_id": context.run_id}).encode(), flow_run_key(flow_run_id))


def mark_closed(store: ObjectStore, run_id: str, status: str) -> None:
    record = _read_json(store, run_record_key(run_id))
    if record is not None:
        store.put_bytes(json.dumps({**record, "closed": status}, sort_keys=True).encode(), run_record_key(run_id))


def run_of_flow_run(store: ObjectStore, flow_run_id: str) -> str | None:
    record = _read_json(store, flow_run_key(flow_run_id))
    return record["run_id"] if record else None


def load_context(store: ObjectStore, run_id: str, config_name: str, context_type):
    """The saved context of `run_id` (a `RunContext`), checked against this config; raises ResumeError."""
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", run_id):
        raise ResumeError(f"run id {run_id!r} is not a drape run id (letters, digits, '.', '_', '-')")
    record = _read_json(store, run_record_key(run_id))
    if record is None:
        raise ResumeError(f"no run {run_id!r} to resume: {store.key_url(run_record_key(run_id))} does not exist")
    if record.get("config_name") != config_name:
        raise ResumeError(
            f"run {run_id} ran config {record.get('config_name')!r}, not {config_name!r}; resume it with that config"
        )
    if record.get("closed") == "FINISHED":
        raise ResumeError(f"run {run_id} finished; there is nothing to resume (start a new run)")
    names = {field.name for field in fields(context_type)}
    return context_type(**{name: value for name, value in record.items() if name in names})


def save_progress(store: ObjectStore, run_id: str, stage: str, phase: str, row: dict) -> dict:
    if phase not in PHASES:
        raise ValueError(f"stage phase {phase!r}; expected one of {PHASES}")
    store.put_bytes(json.dumps({"phase": phase, "row": row}, sort_keys=True).encode(), progress_key(run_id, stage))
    return row


def load_progress(store: ObjectStore, run_id: str) -> dict[str, dict]:
    """stage → {phase, row} for the stages that got past their gate; in stage order, no gaps."""
    found: dict[str, dict] = {
        str(stage): record for stage in STAGES if (record := _read_json(store, progress_key(run_id, stage)))
    }
    ordered = [stage for stage in STAGES if stage in found]
    if ordered != list(STAGES[: len(ordered)]) or any(found[s]["phase"] != "done" for s in ordered[:-1]):
        raise ResumeError(f"run {run_id}: stage records {ordered} are not a prefix of {list(STAGES)} with all but the last done")
    return found


def restore_newest_checkpoint(
    store: ObjectStore, run_id: str, stage: str, checkpoints_dir: Path, *, bases: Path | None = None
) -> Path | None:
    """The newest checkpoint archived for `run_id`'s `stage`, brought back (verified) under
    `checkpoints_dir` (and the frozen base it names into `bases`); None when nothing was archived."""
    name = newest_published(store, run_id, stage)
    if name is None:
        return None
    try:
        return fetch_checkpoint(store, run_id, stage, name, checkpoints_dir, bases=bases)
    except HandoffError as error:
        raise ResumeError(str(error)) from None
