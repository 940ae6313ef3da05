"""The least max wait any policy can give whole-node jobs (`max_wait_floor`): a policy-independent floor.

Whatever the policy, the jobs that each need a node of their own (more than half a node's GPUs:
two never share one) can start no sooner than a schedule of those jobs alone allows. The floor
relaxes that schedule further, so it is a true lower bound on the max wait of every policy:
- every other job is dropped (single-GPU and narrower multi-GPU jobs can always be made to wait);
- every node any of these jobs may use is theirs, all equal;
- a job may be interrupted and moved between nodes at no cost, and need not start in one piece
  (it needs ceil(GPUs / node width) nodes at a time at most, for its duration in all).

Under that relaxation a non-preemptive job that waits W ends by submit + duration + W, so "every
job waits at most W" is feasible only if every job can get its work done between its submit and
that deadline on the nodes: a max-flow test (Horn, 1974: jobs → intervals between the
releases and deadlines → the nodes' capacity in each). The floor is the least W that passes, found
by bisection between 0 and the max wait of first-come-first-served among these jobs alone
(`fcfs_max_wait`, a schedule, so it passes); the floor returned is the largest wait found to fail,
within `precision_s` of the least that passes, so every policy's max wait exceeds it (or it is 0).
Times are whole seconds: submits rounded down, deadlines up, work down, so the rounding only
relaxes further.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.policy.state import GpuState, allows


@dataclass(frozen=True)
class WideFloor:
    floor_s: float  # no policy gives these jobs a max wait under this
    fcfs_s: float  # first-come-first-served among these jobs alone, every node theirs (a schedule)
    jobs: int
    nodes: int


def wide_jobs(trace: list, fleet: list[GpuState]) -> tuple[list[tuple[float, float, int]], list[str], int]:
    """(submit, duration, nodes needed) of the jobs needing a node of their own, submit order; the
    nodes any of them may use; GPUs per node."""
    by_node: dict[str, list[GpuState]] = {}
    for gpu in fleet:
        by_node.setdefault(gpu.node, []).append(gpu)
    width = max((len(g) for g in by_node.values()), default=0)
    wide = sorted((j for j in trace if 2 * j.gpus > width), key=lambda j: (j.submit_s, j.job_id))
    usable = [
        node
        for node, gpus in by_node.items()
        if any(allows(j.models, gpus[0].model) and gpus[0].total_gib >= j.peak_mem_gib for j in wide)
    ]
    jobs = [(j.submit_s, j.duration_s, math.ceil(j.gpus / width)) for j in wide]
    if any(need > len(usable) for *_, need in jobs):
        raise ValueError("max_wait_floor: a job needs more nodes than the fleet has for it")
    return jobs, usable, width


def fcfs_max_wait(jobs: list[tuple[float, float, int]], nodes: int) -> float:
    """The max wait when `jobs` (submit, duration, nodes needed; submit order) start in order, each
    on the first nodes free, with `nodes` nodes."""
    free = [0.0] * nodes  # when each node is next free (a heap)
    last = worst = 0.0
    for submit, duration, need in jobs:
        taken = [heapq.heappop(free) for _ in range(need)]
        start = max(submit, last, taken[-1])
        for _ in taken:
            heapq.heappush(free, start + duration)
        last, worst = start, max(worst, start - submit)
    return worst


def feasible(jobs: list[tuple[float, float, int]], nodes: int, wait_s: float) -> bool:
    """Whether, interrupting and moving freely, every job can end by submit + duration + `wait_s`."""
    return shortfall(jobs, wait_s, lambda lo, hi: nodes * (hi - lo)) == 0


def shortfall(jobs: list[tuple[float, float, int]], wait_s: float | Sequence[float], capacity, scale: int = 1) -> int:
    """The node-seconds x `scale` of `jobs`' work (submit, duration, nodes needed) that cannot be
    done by submit + duration + `wait_s` when the nodes, interrupting and moving jobs freely, offer
    `capacity(lo, hi)` node-seconds x `scale` between whole seconds lo and hi (0: every job can).
    `wait_s`: one wait for every job, or one per job (in `jobs`' order)."""
    waits = [wait_s] * len(jobs) if isinstance(wait_s, int | float) else list(wait_s)
    if len(waits) != len(jobs):
        raise ValueError(f"shortfall: {len(waits)} waits for {len(jobs)} jobs")
    windows = [
        (math.floor(s), math.ceil(s + d + w), math.floor(d) * k * scale, k) for (s, d, k), w in zip(jobs, waits, strict=True)
    ]
    points = sorted({t for start, end, *_ in windows for t in (start, end)})
    spans = list(zip(points, points[1:], strict=False))
    source, sink, first = 0, 1, 2
    graph = _Flow(first + len(windows) + len(spans))
    for index, (start, end, work, need) in enumerate(windows):
        graph.add(source, first + index, work)
        for span, (lo, hi) in enumerate(spans):
            if start <= lo and hi <= end:
                graph.add(first + index, first + len(windows) + span, need * (hi - lo) * scale)
    for span, (lo, hi) in enumerate(spans):
        graph.add(first + len(windows) + span, sink, capacity(lo, hi))
    return sum(work for _, _, work, _ in windows) - graph.max_flow(source, sink)


def max_wait_floor(trace: list, fleet: list[GpuState], precision_s: float = 60.0) -> WideFloor:
    """The floor (module docstring) for `trace`'s jobs that need a node of their own on `fleet`."""
    jobs, usable, _ = wide_jobs(trace, fleet)
    nodes = len(usable)
    fcfs = fcfs_max_wait(jobs, nodes) if jobs else 0.0
    lo, hi = 0.0, fcfs  # lo: the largest known to fail (or 0), hi: known to pass
    if not jobs or feasible(jobs, nodes, 0.0):
        return WideFloor(0.0, fcfs, len(jobs), nodes)
    while hi - lo > precision_s:
        middle = (lo + hi) / 2
        lo, hi = (lo, middle) if feasible(jobs, nodes, middle) else (middle, hi)
    return WideFloor(lo, fcfs, len(jobs), nodes)


class _Flow:
    """Dinic's max flow on integer capacities."""

    def __init__(self, size: int):
        self.edges: list[list[int]] = []  # [to, capacity left, index of the reverse edge]
        self.out: list[list[int]] = [[] for _ in range(size)]

    def add(self, a: int, b: int, capacity: int) -> None:
        self.out[a].append(len(self.edges))
        self.edges.append([b, capacity, len(self.edges) + 1])
        self.out[b].append(len(self.edges))
        self.edges.append([a, 0, len(self.edges) - 1])

    def max_flow(self, source: int, sink: int) -> int:
        total = 0
        while (level := self._levels(source, sink)) is not None:
            cursor = [0] * len(self.out)
            while pushed := self._push(source, sink, math.inf, level, cursor):
                total += int(pushed)
        return total

    def _levels(self, source: int, sink: int) -> list[int] | None:
        level = [-1] * len(self.out)
        level[source] = 0
        queue = deque([source])
        while queue:
            node = queue.popleft()
            for index in self.out[node]:
                to, capacity, _ = self.edges[index]
                if capacity > 0 and level[to] < 0:
                    level[to] = level[node] + 1
                    queue.append(to)
        return level if level[sink] >= 0 else None

    def _push(self, node: int, sink: int, limit: float, level: list[int], cursor: list[int]) -> float:
        if node == sink:
            return limit
        while cursor[node] < len(self.out[node]):
            edge = self.edges[self.out[node][cursor[node]]]
            if edge[1] > 0 and level[edge[0]] == level[node] + 1:
                pushed = self._push(edge[0], sink, min(limit, edge[1]), level, cursor)
                if pushed:
                    edge[1] -= int(pushed)
                    self.edges[edge[2]][1] += int(pushed)
                    return pushed
            cursor[node] += 1
        return 0
