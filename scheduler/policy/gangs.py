"""Gangs across nodes: where a multi-GPU job may run on several nodes at once, for engines that
start one job across nodes (Slurm: ``srun`` torchrun on every node of the allocation).

The drape policy keeps a multi-GPU job on one node. With `PolicyConfig.span_nodes` (the dispatcher
sets it for an engine that `spans_nodes`), a multi-GPU job that finds no single node takes GPUs of
one model on several nodes: a job wider than every node always, a narrower one when no node has
room for it now (starting now, spread over nodes, rather than waiting for one node to clear). A
Slurm job has the same GPUs on every node (``--gres=gpu:g`` per node, torchrun's
``--nproc-per-node``), so a spanning placement is k nodes × g GPUs, g a divisor of the job's
width: the largest g that k nodes hold (the fewest nodes, the least traffic between them), on the
nodes with the fewest free GPUs that hold g (the fullest first: whole nodes stay whole for whole-node
jobs), then by name (`even_split`). The same rule places a job now (`scheduler/policy/pool.py`),
reserves its GPUs for later (`scheduler/policy/reservation.py: reserve_span`), chooses what an
overdue one stops (`scheduler/policy/checkpoints.py`), and tells whether a fleet could ever hold it
(`fits_across_nodes`, the dispatcher's refusal).

`spanning(plan)` is kept for the baseline policies only (FIFO and the Kueue-like one know nothing of
nodes): a job wider than every node first takes whole idle nodes.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.policy.state import GpuState, JobRequest, Placement, PolicyConfig, allowed


def even_split(width: int, free: dict[str, list[str]], most: int) -> tuple[str, ...] | None:
    """`width` GPUs as k nodes × g GPUs from `free` (node → its free GPUs of one kind, in the order
    to take them; `most`: the widest node's GPUs), chosen as the module docstring says, or None."""
    for per_node in range(min(width, most), 0, -1):
        if width % per_node:
            continue
        needed = width // per_node
        holding = sorted((len(uuids), node) for node, uuids in free.items() if len(uuids) >= per_node)
        if len(holding) >= needed:
            return tuple(uuid for node in sorted(node for _, node in holding[:needed]) for uuid in free[node][:per_node])
    return None


def nodes_of(uuids: tuple[str, ...], gpus: dict[str, GpuState]) -> int:
    return len({gpus[uuid].node for uuid in uuids})


def _nodes(gpus: list[GpuState]) -> dict[str, list[GpuState]]:
    by_node: dict[str, list[GpuState]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    return dict(sorted(by_node.items()))


def _width(by_node: dict[str, list[GpuState]]) -> int:
    return max((len(node) for node in by_node.values()), default=0)


def _by_kind(gpus: list[GpuState], holds: Callable[[GpuState], bool]) -> dict[tuple[str, float], dict[str, list[str]]]:
    """The GPUs `holds` accepts, per kind (model, memory) and node: the GPUs one gang across nodes may combine."""
    by_kind: dict[tuple[str, float], dict[str, list[str]]] = {}
    for gpu in gpus:
        if holds(gpu):
            by_kind.setdefault((gpu.model, gpu.total_gib), {}).setdefault(gpu.node, []).append(gpu.uuid)
    return by_kind


def fits_across_nodes(job: JobRequest, gpus: list[GpuState]) -> bool:
    """Whether the fleet, empty, could hold `job` as k nodes × g GPUs of one model (`even_split`)."""
    by_kind = _by_kind(gpus, lambda gpu: gpu.total_gib >= job.mem_gib and allowed(job, gpu.model))
    most = _width(_nodes(gpus))
    return any(even_split(job.gpus, free, most) is not None for free in by_kind.values())


def unplaceable(gpus: int, mem_gib: float, fleet: list[GpuState], *, across_nodes: bool = False) -> str | None:
    """Why no node of `fleet` can ever hold a job of `gpus` × `mem_gib` (even empty), or None;
    `across_nodes` (an engine that spans nodes): whole nodes together may hold it."""
    if across_nodes and fits_across_nodes(JobRequest("-", 0, 0.0, gpus, mem_gib, 0.0), fleet):
        return None
    fits: dict[str, int] = {}
    for gpu in fleet:
        if gpu.total_gib >= mem_gib:
            fits[gpu.node] = fits.get(gpu.node, 0) + 1
    if max(fits.values(), default=0) >= gpus:
        return None
    largest = max(fleet, key=lambda g: g.total_gib)
    per_node: dict[str, int] = {}
    for gpu in fleet:
        per_node[gpu.node] = per_node.get(gpu.node, 0) + 1
    across = _closest_split(gpus, mem_gib, fleet) if across_nodes else None
    return (
        f"no node of the fleet can hold it: it needs {gpus} GPU(s) with {mem_gib:.1f} GiB each on one node; "
        f"the largest GPU has {largest.total_gib:.1f} GiB, the largest node {max(per_node.values())} GPU(s), and "
        f"{max(fits.values(), default=0)} GPU(s) on one node are large enough. "
        + (
            f"Nor can nodes together: a gang takes the same number of GPUs, of one model, on each of its nodes, "
            f"and at best {across}. Lower the job's memory (batch size, gpus), give it a GPU count that splits "
            "evenly over such nodes, or add such nodes"
            if across
            else "Lower the job's memory (batch size, gpus) or add such nodes"
        )
    )


def _closest_split(width: int, mem_gib: float, fleet: list[GpuState]) -> str | None:
    """For a gang that fits no way across nodes: the k nodes × g GPUs split (g dividing `width`) that
    comes closest, as words (the nodes it needs and the nodes the fleet has), or None when no GPU is
    large enough."""
    best: tuple[int, int, str, int, int] | None = None  # (shortfall, -per node, model, needed, have)
    for (model, _), nodes in sorted(_by_kind(fleet, lambda gpu: gpu.total_gib >= mem_gib).items()):
        for per_node in range(min(width, max(len(uuids) for uuids in nodes.values())), 0, -1):
            if width % per_node == 0:
                needed, have = width // per_node, sum(1 for uuids in nodes.values() if len(uuids) >= per_node)
                candidate = (needed - have, -per_node, model, needed, have)
                best = candidate if best is None or candidate < best else best
    if best is None:
        return None
    _, per_node, model, needed, have = best
    return f"{needed} node(s) × {-per_node} GPU(s) of {model}, where the fleet has {have} such node(s)"


def never_fits(job: JobRequest, fleet: list[GpuState], span: bool) -> str | None:
    """Why `fleet`, even empty, can never hold `job` (its GPU count, memory per GPU and the models it
    allows; `span`: an engine that starts a gang across nodes), or None. The dispatcher's refusal and
    the simulator's check of a trace before it replays one (`scheduler/sim/model.py: check_fits`)."""
    allowed_gpus = [gpu for gpu in fleet if allowed(job, gpu.model)]
    if not allowed_gpus:
        return f"no GPU of the fleet is one of the models it allows ({', '.join(job.models)})"
    return unplaceable(job.gpus, job.mem_gib, allowed_gpus, across_nodes=span)


def _holds(job: JobRequest, node: list[GpuState]) -> bool:
    return all(allowed(job, gpu.model) and gpu.total_gib >= job.mem_gib for gpu in node)


def spanning(plan: Callable[..., list[Placement]]) -> Callable[..., list[Placement]]:
    """A baseline `plan`, with jobs wider than every node (a multiple of a node's GPUs) first given
    whole idle nodes, the first by name."""

    def plan_spanning(
        pending: list[JobRequest], gpus: list[GpuState], running: list, now: float, config: PolicyConfig = PolicyConfig()
    ) -> list[Placement]:
        by_node, placements, taken = _nodes(gpus), [], set()
        width, narrow = _width(by_node), []
        for job in sorted(pending, key=lambda j: (-j.priority, j.submit_s, j.id)):
            if width == 0 or job.gpus <= width or job.gpus % width:
                narrow.append(job)
                continue
            free = [
                name
                for name, node in by_node.items()
                if name not in taken and len(node) == width and _holds(job, node) and all(g.is_idle(config) for g in node)
            ]
            if len(free) >= job.gpus // width:
                chosen = free[: job.gpus // width]
                taken.update(chosen)
                placements.append(Placement(job.id, tuple(gpu.uuid for name in chosen for gpu in by_node[name]), job.mem_gib))
        rest = [gpu for gpu in gpus if gpu.node not in taken]
        return placements + plan(narrow, rest, running, now, config)

    return plan_spanning
