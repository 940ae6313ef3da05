"""The one shape every engine has, and the choice of engine by config.

An engine starts a claimed job on the GPUs the queue placed it on and answers for it by the
`handle` its launch returned (the queue records it):

- `launch(job, gpus) -> handle`
- `poll(job_id, handle) -> Outcome | None` (None while it runs or waits in the engine's own queue)
- `cancel(job_id, handle)`
- `sees(handle) -> bool`: whether this engine can watch that job, so that a dispatcher that
  restarted, or another one, adopts a running job instead of launching it a second time.

One folder per engine, none importing another (`tests/unit/test_engines.py` holds them to it):
`local/` (processes on this machine, or on the queue's node through `queue.node_commands`),
`kubernetes/` (Jobs, indexed Jobs, PyTorchJobs, Kueue workloads) and `slurm/` (sbatch scripts).
Each engine's `launcher.py` exposes `build(config, log_dir)`; `build_launcher` imports only the
one `queue.launcher` names. What they share (the job's environment, how a python command becomes
torchrun's program, where a job landed) lives here.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Protocol

from drape.secrets import SECRET_VARIABLES
from scheduler.policy import GpuState

ENGINES = {
    "local": "scheduler.engines.local.launcher",
    "kubernetes": "scheduler.engines.kubernetes.launcher",
    "slurm": "scheduler.engines.slurm.launcher",
}
# engines that start one job across several nodes (the dispatcher then places jobs wider than a
# node on whole nodes, scheduler/policy/gangs.py); the local engine runs a job on one machine
SPANS_NODES = {"slurm"}


def spans_nodes(config) -> bool:
    return config.queue.launcher in SPANS_NODES


@dataclass(frozen=True)
class Landing:
    """Where one pod or rank of a job runs: its node, and the device indices there when the engine reports
    them (with their UUIDs where known: DCGM's, which name the GPUs of a fleet read from DCGM)."""

    node: str
    devices: tuple[int, ...] | None = None
    uuids: tuple[str, ...] | None = None


_INDEX = re.compile(r"(?:cuda|gpu)(\d+)$")


def gpu_index(uuid: str) -> int | None:
    """The device index in a fleet GPU's uuid (`<host>/gpu3`, `<host>/cuda3` → 3), None for a DCGM UUID."""
    match = _INDEX.search(uuid)
    return int(match.group(1)) if match else None


@dataclass
class Outcome:
    exit_code: int
    message: str = ""
    peak_gib: float | None = None


class Engine(Protocol):
    def launch(self, job: dict, gpus: list[GpuState]) -> str: ...

    def sees(self, handle: str | None) -> bool: ...

    def poll(self, job_id: str, handle: str) -> Outcome | None: ...

    def cancel(self, job_id: str, handle: str) -> None: ...


def build_launcher(config, log_dir: str | Path) -> Engine:
    """The engine `queue.launcher` names (its module imported now, and only it)."""
    module = importlib.import_module(ENGINES[config.queue.launcher])
    return module.build(config, Path(log_dir))


def device_indices(gpus: list[GpuState]) -> str:
    """`CUDA_VISIBLE_DEVICES` for the assigned GPUs (`<host>/cuda<i>` → i; the CPU slot → '')."""
    return ",".join(str(index) for g in gpus if (index := gpu_index(g.uuid)) is not None)


def claimed_view(placements: Iterable, by_uuid: dict[str, GpuState]) -> dict[str, list[GpuState]]:
    """Job id → its GPUs as they stand once this cycle's `placements` are claimed: `jobs` counts what
    the ledger held plus the cycle's other jobs on the same GPU (what a launcher needs to tell a
    shared GPU from one of its own)."""
    placements = list(placements)
    added: dict[str, int] = {}
    for placement in placements:
        for uuid in placement.gpus:
            added[uuid] = added.get(uuid, 0) + 1
    return {p.job_id: [replace(by_uuid[u], jobs=by_uuid[u].jobs + added[u] - 1) for u in p.gpus] for p in placements}


def is_python(program: str) -> bool:
    return PurePosixPath(program).name.startswith("python")


def module_args(command: list[str]) -> list[str]:
    """`python -m mod args` → `-m mod args` for torchrun (which runs its own interpreter)."""
    return command[1:] if command and is_python(command[0]) else command


def torchrun_program(command: list[str]) -> list[str]:
    """What torchrun starts in each rank: a python command's `-m module args` (torchrun brings its
    own interpreter), any other program as it is (`--no-python`)."""
    return module_args(command) if command and is_python(command[0]) else ["--no-python", *command]


def exit_message(code: int) -> str:
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        return f"exit code {code} (killed by {signal.Signals(code - 128).name})"
    if code < 0 and -code in signal.Signals._value2member_map_:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


_PLAIN_VARIABLES = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "VIRTUAL_ENV", "LD_LIBRARY_PATH"}
_PLAIN_PREFIXES = ("LC_", "PYTHON", "DRAPE_", "CUDA_", "NCCL_", "TORCH_", "OMP_", "MKL_", "PREFECT_SERVER_ANALYTICS")


def job_environment(passed: Iterable[str] = ()) -> dict[str, str]:
    """A job's environment: the plain variables of this one (see `_PLAIN_*`), none of the secret
    ones (`drape.secrets.SECRET_VARIABLES`), plus the variables named in `passed`
    (`queue.job_environment`). Never the dispatcher's whole environment."""
    names = set(passed)
    return {
        name: value
        for name, value in os.environ.items()
        if name in names or (name not in SECRET_VARIABLES and (name in _PLAIN_VARIABLES or name.startswith(_PLAIN_PREFIXES)))
    }
