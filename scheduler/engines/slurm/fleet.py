"""Reading the fleet from a Slurm cluster (`queue.fleet: slurm`): the Slurm clients run with a bounded
time and output, and their answers parsed as untrusted (scheduler/engines/slurm/nodes.py)."""

from __future__ import annotations

import os
import subprocess

from scheduler.engines.slurm.nodes import SlurmNode, fleet_gpus, parse_nodes, parse_partitions
from scheduler.policy import GpuState

TIMEOUT_SECONDS = 30.0
MAX_OUTPUT = 32 * 2**20  # 32 MiB of scontrol output: ~2,000 bytes a node, far past any cluster


class SlurmUnreachable(RuntimeError):
    """A Slurm client failed or answered nothing: names the command and Slurm's words."""


def slurm_output(*argv: str, env: dict[str, str] | None = None) -> str:
    """The stdout of a Slurm client (scontrol, sinfo), or SlurmUnreachable with its stderr."""
    try:
        done = subprocess.run(argv, env=env or {**os.environ}, capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SlurmUnreachable(f"{' '.join(argv[:3])}: {error}") from None
    if done.returncode:
        raise SlurmUnreachable(f"{' '.join(argv[:3])}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[:500]}")
    if len(done.stdout) > MAX_OUTPUT:
        raise SlurmUnreachable(f"{' '.join(argv[:3])}: {len(done.stdout)} bytes of output (at most {MAX_OUTPUT})")
    return done.stdout


def read_nodes(names: list[str] | None = None, env: dict[str, str] | None = None) -> list[SlurmNode]:
    """The cluster's nodes (`names`: only those; a name Slurm does not know is left out)."""
    if not names:
        return parse_nodes(slurm_output("scontrol", "show", "node", "-o", "-d", env=env))
    found = []
    for name in names:
        try:
            found += parse_nodes(slurm_output("scontrol", "show", "node", "-o", "-d", name, env=env))
        except SlurmUnreachable as error:
            if "not found" not in str(error).lower():
                raise
    return found


def read_partitions(env: dict[str, str] | None = None) -> dict[str, int | None]:
    """Partition → its time limit in minutes (None: none), from sinfo."""
    return parse_partitions(slurm_output("sinfo", "-h", "-o", "%R|%l", env=env))


def model_names(settings) -> dict[str, str]:
    """gres type → the fleet's model name (`queue.slurm.gres_types` read backwards; else the type)."""
    return {kind: model for model, kind in settings.gres_types.items()}


def slurm_gpus(settings, env: dict[str, str] | None = None, ours: set[str] | None = None) -> list[GpuState]:
    """The fleet's GPUs as Slurm has them now (nodes/fleet_gpus): with `queue.slurm.partition`, only
    that partition's nodes, since its jobs can run nowhere else. `ours`: the GPUs drape's running jobs
    hold, so that those other jobs hold are seen full (`nodes.foreign`); None: not looked at."""
    nodes = read_nodes(env=env)
    if settings.partition:
        nodes = [node for node in nodes if settings.partition in node.partitions]
    return fleet_gpus(nodes, settings.gpu_memory_gib, model_names(settings), ours)
