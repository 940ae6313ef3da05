"""Jobs wider than a node, placed on whole idle nodes, for engines that start a job across nodes.

The drape policy (scheduler/policy/plan.py) keeps a multi-GPU job on one node. An engine that runs one
job across several (Slurm: ``srun`` torchrun on every node of the allocation) says so
(`spans_nodes`), and the dispatcher then plans with `spanning(plan)`: a waiting job wider than
every node of the fleet, whose GPU count is a multiple of a node's, takes that many whole idle
nodes (every GPU idle, of a model it allows, each holding its memory profile), the first by name,
before the policy places the others on what is left. `fits_across_nodes` is the fleet-level
check the dispatcher's refusal uses: whether enough such nodes exist at all.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.policy.state import GpuState, JobRequest, Placement, PolicyConfig, allowed


def _nodes(gpus: list[GpuState]) -> dict[str, list[GpuState]]:
    by_node: dict[str, list[GpuState]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    return dict(sorted(by_node.items()))


def _width(by_node: dict[str, list[GpuState]]) -> int:
    return max((len(node) for node in by_node.values()), default=0)


def _holds(job: JobRequest, node: list[GpuState]) -> bool:
    return all(allowed(job, gpu.model) and gpu.total_gib >= job.mem_gib for gpu in node)


def nodes_needed(job: JobRequest, by_node: dict[str, list[GpuState]]) -> int | None:
    """How many whole nodes of the fleet's width `job` takes, None when it fits on one (or is not a multiple)."""
    width = _width(by_node)
    if width == 0 or job.gpus <= width or job.gpus % width:
        return None
    return job.gpus // width


def fits_across_nodes(job: JobRequest, gpus: list[GpuState]) -> bool:
    """Whether the fleet, empty, could hold `job` on whole nodes."""
    by_node = _nodes(gpus)
    needed = nodes_needed(job, by_node)
    width = _width(by_node)
    return needed is not None and sum(1 for node in by_node.values() if len(node) == width and _holds(job, node)) >= needed


def spanning(plan: Callable[..., list[Placement]]) -> Callable[..., list[Placement]]:
    """`plan`, with jobs wider than a node first given whole idle nodes (see the module docstring)."""

    def plan_spanning(
        pending: list[JobRequest], gpus: list[GpuState], running: list, now: float, config: PolicyConfig = PolicyConfig()
    ) -> list[Placement]:
        by_node, placements, taken = _nodes(gpus), [], set()
        width, narrow = _width(by_node), []
        for job in sorted(pending, key=lambda j: (-j.priority, j.submit_s, j.id)):
            needed = nodes_needed(job, by_node)
            if needed is None:
                narrow.append(job)
                continue
            free = [
                name
                for name, node in by_node.items()
                if name not in taken and len(node) == width and _holds(job, node) and all(g.is_idle(config) for g in node)
            ]
            if len(free) >= needed:
                chosen = free[:needed]
                taken.update(chosen)
                uuids = tuple(gpu.uuid for name in chosen for gpu in by_node[name])
                placements.append(Placement(job.id, uuids, job.mem_gib))
        rest = [gpu for gpu in gpus if gpu.node not in taken]
        return placements + plan(narrow, rest, running, now, config)

    return plan_spanning
