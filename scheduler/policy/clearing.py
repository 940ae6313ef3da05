"""When each node clears: the backfill reservation of a multi-GPU job without walking the fleet.

`reserve` (`scheduler/policy/reservation.py`) walks the running jobs from the soonest expected end and
stops at the first whose end leaves some node with enough idle GPUs for the waiting job. For a
job of width w on a node of one GPU kind, that moment is the node's w-th smallest GPU clearing
time (a GPU clears when the last job on it ends; an idle GPU has cleared), so the walk's answer
is the node with the smallest such time. A `Clearing` keeps, per GPU kind and width, the nodes
sorted by it (updated as jobs start and end on a node), and `reserve` reads the first node of
each kind. Times are keys (expected end, start number): the walk's order, ties in start order;
nodes that clear at one key (a gang across nodes ending) by name, as the walk takes them.

Nodes the planning pass changed, nodes of mixed kinds, and the winner itself are walked exactly,
job by job, as `reserve` does (`_node_walk`); where the index and the walk disagree (a GPU
holding memory no running job accounts for), the whole walk decides (`reserve_walk`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sortedcontainers import SortedList

from scheduler.policy.reservation import Reservation, _fits_node, future_state, reserve_walk
from scheduler.policy.state import JobRequest, Placement, RunningJob

if TYPE_CHECKING:
    from scheduler.policy.planner import Planner

Key = tuple[float, float]  # (expected end, start number)
NEVER: Key = (float("inf"), float("inf"))


class Clearing:
    """Per (GPU kind, width): uniform nodes by the time they will have that many GPUs cleared."""

    def __init__(self, planner: Planner):
        self.planner = planner
        self.index: dict[tuple, SortedList] = {}  # (kind, width) → (key, node)
        self.keys: dict[str, dict[int, Key]] = {}  # node → width → its key in the index
        self.kinds = sorted(set(planner.pool.kind.values()))  # of the uniform nodes
        self.walked = 0  # reservations the index could not tell, left to the whole walk

    def refresh(self, node: str) -> None:
        """`node`'s jobs changed: its place in every index of its kind follows."""
        kind = self.planner.pool.kind.get(node)
        if kind is None:
            return
        held = self.keys.setdefault(node, {})
        clears = None
        for (indexed, width), nodes in self.index.items():
            if indexed != kind:
                continue
            clears = clears if clears is not None else self._clears(node)
            key = _trigger(clears, width)
            if held.get(width) != key:
                if width in held:
                    nodes.discard((held[width], node))
                nodes.add((key, node))
                held[width] = key

    def _clears(self, node: str) -> tuple[list[Key], Key]:
        """The node's GPUs' clearing keys, sorted, and its first job end's key (kept state)."""
        planner, clears, first = self.planner, [], NEVER
        for uuid in planner.nodes[node]:
            jobs = planner.on_gpu.get(uuid, ())
            keys = [(job.expected_end_s, planner.number[job.id]) for job in jobs]
            first = min([first, *keys])
            clears.append(max(keys) if keys else (float("-inf"), -1.0))
            if planner.gpus[uuid].jobs != len(keys):
                clears[-1] = NEVER
        return sorted(clears), first

    def _first(self, kind: tuple, width: int, skip: set[str]) -> tuple[Key, str] | None:
        if (kind, width) not in self.index:
            self.index[(kind, width)] = SortedList()
            for node, of in self.planner.pool.kind.items():
                if of == kind:
                    self.keys.setdefault(node, {})[width] = key = _trigger(self._clears(node), width)
                    self.index[(kind, width)].add((key, node))
        for key, node in self.index[(kind, width)]:
            if node not in skip:
                return (key, node) if key != NEVER else None
        return None

    def reserve(self, head: JobRequest, placements: list[Placement], now: float) -> Reservation | None:
        """`reserve_walk`'s reservation for multi-GPU `head` in a pass that made `placements`."""
        planner = self.planner
        pool = planner.pool
        touched = {pool.gpus[uuid].node for uuid in pool.journal or {}} | set(pool.mixed)
        best: tuple[Key, float, tuple[str, ...]] | None = None
        ranked: tuple[Key, str] = NEVER, ""  # best's (key, node): nodes that clear at one key, the first by name
        placed: dict[str, list[tuple[int, Placement]]] = {}  # node → this pass's placements on it
        for i, p in enumerate(placements):
            for node in {pool.gpus[uuid].node for uuid in p.gpus}:
                placed.setdefault(node, []).append((i, p))
        for node in touched:
            found = _node_walk(planner, node, head, placed.get(node, []), now)
            if found is not None and (best is None or (found[0], node) < ranked):
                best, ranked = found, (found[0], node)
        for kind in self.kinds:
            if not pool._kind_ok(head, kind):
                continue
            first = self._first(kind, head.gpus, touched)
            if first is not None and (best is None or first < ranked):
                found = _node_walk(planner, first[1], head, placed.get(first[1], []), now)
                if found is None or found[0] != first[0]:  # the index does not tell this fleet: walk it all
                    self.walked += 1
                    return reserve_walk(head, pool.gpus, planner.nodes, planner._ending(placements, now), now, planner.config)
                best, ranked = found, first
        return Reservation(best[1], frozenset(best[2])) if best else None


def _trigger(clears: tuple[list[Key], Key], width: int) -> Key:
    """When a node with these clearing keys first has `width` GPUs cleared, as the walk sees it:
    at the first job end on it if that many are clear already."""
    keys, first = clears
    if len(keys) < width:
        return NEVER
    return first if keys[width - 1][0] == float("-inf") else keys[width - 1]


def _node_walk(
    planner: Planner, node: str, head: JobRequest, placed: list[tuple[int, Placement]], now: float
) -> tuple[Key, float, tuple[str, ...]] | None:
    """The walk of `reserve_walk` over one node's jobs: running, and this pass's placements on it
    (`placed`: each with its number in the pass)."""
    uuids = set(planner.nodes[node])
    jobs: dict[str, tuple[Key, RunningJob]] = {}
    for uuid in uuids:
        for job in planner.on_gpu.get(uuid, ()):
            jobs[job.id] = ((job.expected_end_s, planner.number[job.id]), job)
    for i, p in placed:
        if uuids.intersection(p.gpus):
            end = now + planner.pending[p.job_id].duration_s
            jobs[p.job_id] = ((end, planner.started + i), RunningJob(p.job_id, p.gpus, p.mem_gib, end))
    future = {uuid: future_state(planner.pool.gpus[uuid]) for uuid in planner.nodes[node]}
    gpus = list(future.values())
    for key, job in sorted(jobs.values(), key=lambda entry: entry[0]):
        for uuid in job.gpus:
            if uuid in future:
                gpu = future[uuid]
                gpu.allocated_gib = max(gpu.allocated_gib - job.mem_gib, 0.0)
                gpu.jobs = max(gpu.jobs - 1, 0)
                gpu.exclusive = gpu.exclusive and len(job.gpus) == 1
        chosen = _fits_node(head, gpus, planner.config)
        if chosen:
            return key, max(job.expected_end_s, now), chosen
    return None
