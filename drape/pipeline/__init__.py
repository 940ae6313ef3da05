"""The stage DAG's operations, one function per box, each one call for a Prefect task (`tasks/`)
and just as usable without Prefect:

    start_run → for each stage: prestage(next) ‖ train → gate → passed_gate → snapshot → archive_passed
                → summarize; a failed gate: reject; any other failure: abort

A run records its context and each stage's progress in the object store, so a run that died
resumes where it was (`start_run(resume=…)`, `stage_progress`; `resume` says how).

`run` holds the run's context and the resources its steps share (one object store, tracker and
shard cache per run); `stages` the boxes; `standalone` what operators run outside a run. What
they read and write lives where `drape.layout` says.

Invariant after every archive: the current baselines (weights without optimizer state, and their
control outputs), the control set, the shards of the stage in progress or next, and what the
retention policy keeps live until the run ends (`live_until: run_end`; by default nothing), which
`close_run` frees once its archived copy is verified.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drape.layout import live_root
    from drape.pipeline.queue_job import finish_train, train_command, train_result_ready, warm_node
    from drape.pipeline.resume import ResumeError, run_of_flow_run
    from drape.pipeline.run import (
        GateFailed,
        RunContext,
        close_run,
        release_flow_run_leases,
        resources,
        start_run,
        summarize,
    )
    from drape.pipeline.stages import (
        abort,
        archive,
        archive_passed,
        gate,
        passed_gate,
        prestage,
        reject,
        snapshot,
        stage_job,
        stage_progress,
        start_checkpoint,
        train,
    )
    from drape.pipeline.standalone import prestage_dataset, sweep

# Each name loads its module on first use (PEP 562): importing the package, as every flow module
# does, loads no torch, diffusers or MLflow, so `prefect deploy` and the UI's parameter forms do
# not wait on them; a flow run loads them when its first task runs.
_WHERE = {
    "live_root": "drape.layout",
    **dict.fromkeys(("finish_train", "train_command", "train_result_ready", "warm_node"), "drape.pipeline.queue_job"),
    **dict.fromkeys(("ResumeError", "run_of_flow_run"), "drape.pipeline.resume"),
    **dict.fromkeys(
        ("GateFailed", "RunContext", "close_run", "release_flow_run_leases", "resources", "start_run", "summarize"),
        "drape.pipeline.run",
    ),
    **dict.fromkeys(
        (
            "abort",
            "archive",
            "archive_passed",
            "gate",
            "passed_gate",
            "prestage",
            "reject",
            "snapshot",
            "stage_job",
            "stage_progress",
            "start_checkpoint",
            "train",
        ),
        "drape.pipeline.stages",
    ),
    **dict.fromkeys(("prestage_dataset", "sweep"), "drape.pipeline.standalone"),
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'drape.pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "GateFailed",
    "ResumeError",
    "RunContext",
    "abort",
    "archive",
    "archive_passed",
    "passed_gate",
    "run_of_flow_run",
    "close_run",
    "finish_train",
    "gate",
    "live_root",
    "prestage",
    "prestage_dataset",
    "reject",
    "release_flow_run_leases",
    "resources",
    "snapshot",
    "stage_job",
    "stage_progress",
    "start_checkpoint",
    "start_run",
    "summarize",
    "sweep",
    "train",
    "train_command",
    "train_result_ready",
    "warm_node",
]
