"""How long whole-node jobs wait at the least beside single-GPU jobs that start on arrival (`gang_floor`).

`gang_floor` replays a trace's whole-node (multi-GPU) jobs against the nodes that single-GPU jobs
leave them, under assumptions that all favour the whole-node jobs:
- every single-GPU job starts the moment it is submitted, runs for its duration and takes 1/`per_gpu`
  of a GPU (`per_gpu` = 2: two jobs share each GPU at no slowdown), packed at every instant into as
  few nodes as possible, and moved between nodes for free;
- single-GPU jobs that allow other GPU models fill the nodes the whole-node jobs may not use first
  (after the jobs that may run only there), and spill over onto theirs only past that room;
- a whole-node job takes ceil(GPUs / GPUs per node) free nodes it may use, in order of submission,
  and is never interrupted, even when single-GPU jobs would then lack room (they are not delayed).

A policy that starts single-GPU jobs on arrival and never slows them (as today's drape does when
it does not co-locate) leaves the whole-node jobs at least this short of nodes; with every node a
whole-node job can use equal, submission order is how the replay shares them out. Its waits say
whether "no multi-GPU job waits over an hour" can hold beside "single-GPU waits no worse than
today" on a workload (`benchmarks/scheduler.py` prints them beside each policy's).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass

from scheduler.policy import GpuState, allows


@dataclass(frozen=True)
class Floor:
    waits_s: list[float]  # per whole-node job, in submission order
    per_gpu: int

    @property
    def mean_s(self) -> float:
        return sum(self.waits_s) / len(self.waits_s) if self.waits_s else 0.0

    @property
    def max_s(self) -> float:
        return max(self.waits_s, default=0.0)

    def over(self, seconds: float) -> int:
        """How many whole-node jobs wait longer than `seconds`."""
        return sum(wait > seconds for wait in self.waits_s)


PINNED, FLEXIBLE, AWAY = "pinned", "flexible", "away"  # a single-GPU job's nodes: usable only, both, others only


def _single_changes(trace: list, usable: list[str], by_node: dict[str, list[GpuState]]) -> list[tuple[float, int, str]]:
    """The single-GPU jobs as (time, +1 at start / -1 at end, where it may run: PINNED, FLEXIBLE or
    AWAY from the usable nodes), ends before starts at one instant."""
    changes = []
    for job in trace:
        if job.gpus == 1:
            on = {node in usable for node, gpus in by_node.items() if allows(job.models, gpus[0].model)}
            where = FLEXIBLE if on == {True, False} else AWAY if on == {False} else PINNED
            changes += [(job.submit_s, 1, where), (job.submit_s + job.duration_s, -1, where)]
    return sorted(changes, key=lambda change: (change[0], change[1]))


def gang_floor(trace: list, fleet: list[GpuState], per_gpu: int = 1) -> Floor:
    """The floor (module docstring) for `trace`'s multi-GPU jobs on `fleet`; every multi-GPU job must
    allow the same GPU models (the nodes they compete for), or this raises ValueError."""
    if per_gpu < 1:
        raise ValueError(f"per_gpu must be at least 1, got {per_gpu}")
    gangs = sorted((job for job in trace if job.gpus > 1), key=lambda job: (job.submit_s, job.job_id))
    if len({tuple(job.models) for job in gangs}) > 1:
        raise ValueError("gang_floor: the multi-GPU jobs allow different GPU models; compute a floor per model set")
    by_node: dict[str, list[GpuState]] = defaultdict(list)
    for gpu in fleet:
        by_node[gpu.node].append(gpu)
    width = max(len(gpus) for gpus in by_node.values())
    usable = [node for node, gpus in by_node.items() if not gangs or allows(gangs[0].models, gpus[0].model)]
    off_usable = [node for node in by_node if node not in usable]
    elsewhere = sum(len(by_node[node]) for node in off_usable) * per_gpu  # single-GPU room off the usable nodes
    changes = _single_changes(trace, usable, by_node)
    running = {PINNED: 0, FLEXIBLE: 0, AWAY: 0}  # single-GPU jobs running, by where they may run
    ends: list[tuple[float, int]] = []  # (end, nodes) of running whole-node jobs
    queue: list = []
    waits: list[float] = []
    busy = next_change = index = 0
    times = sorted({job.submit_s for job in gangs} | {change[0] for change in changes})
    for now in _instants(times, ends, lambda: len(waits) < len(gangs)):
        while ends and ends[0][0] <= now:
            busy -= heapq.heappop(ends)[1]
        while next_change < len(changes) and changes[next_change][0] <= now:
            running[changes[next_change][2]] += changes[next_change][1]
            next_change += 1
        while index < len(gangs) and gangs[index].submit_s <= now:
            queue.append(gangs[index])
            index += 1
        # the usable nodes the running single-GPU jobs fill, packed: those that may run elsewhere go
        # there first, after those that can run nowhere else
        spill = max(0, running[FLEXIBLE] - max(0, elsewhere - running[AWAY]))
        blocked = math.ceil(math.ceil((running[PINNED] + spill) / per_gpu) / width)
        while queue and len(usable) - blocked - busy >= (need := math.ceil(queue[0].gpus / width)):
            job = queue.pop(0)
            waits.append(now - job.submit_s)
            busy += need
            heapq.heappush(ends, (now + job.duration_s, need))
    return Floor(waits, per_gpu)


def _instants(times: list[float], ends: list[tuple[float, int]], waiting):
    """Each next instant something changes (a time in `times`, or the earliest of `ends`, read live)
    while `waiting()`."""
    clock = 0
    while waiting():
        candidates = [*times[clock : clock + 1], *(ends[0][:1] if ends else ())]
        if not candidates:
            raise RuntimeError("gang_floor: whole-node jobs wait with nothing left to free a node (a job wider than the fleet?)")
        now = min(candidates)
        while clock < len(times) and times[clock] <= now:
            clock += 1
        yield now
