"""The least max wait of whole-node jobs beside single-GPU jobs that wait little (`joint_floor`).

`benchmarks/floors/wide_floor.py`'s floor drops every other job; this one keeps the single-GPU jobs, which
a goal on their mean wait forbids to push aside for long. It is a true lower bound on the max wait
of the jobs needing a node of their own (more than half a node's GPUs) for every policy in a class,
under the simulator's model of sharing (`scheduler/sim/reference.py`), and relaxes all else:
- what a single-GPU job holds: a GPU holding a multi-GPU job holds nothing else (drape's rule, and
  their pace); on a GPU holding k single-GPU jobs of declared shares s_j each runs at pace
  min(1, (1 + CONTENTION_OVERLAP (k - 1)) / sum s_j), so sum s_j x pace_j <= F = 1 + CONTENTION_OVERLAP
  (K - 1), K the most single-GPU jobs one GPU's memory can hold. So the single-GPU jobs hold at
  least sum a_j x pace_j GPUs, a_j = s_j / F (1 for a job that asked to run alone): K = 4 and
  F = 1.21 for the 20 GiB jobs on 80 GiB GPUs, much tighter packing than "two to a GPU at no cost";
- where: jobs that may use GPUs the whole-node jobs may not fill those first (after those that may
  use nothing else), at no cost, as `benchmarks/floors/gang_floor.py` does; the rest fill the whole-node jobs'
  nodes, packed into as few as possible, moved for free;
- the whole-node jobs: every other job is dropped, and they may be interrupted and moved at no cost
  (the max-flow of `wide_floor.py`, counted in GPUs: a job of g GPUs takes at most g at a time, and
  a span offers the integral of the GPUs the single-GPU jobs leave over it; a job narrower than a
  node leaves the rest of its node to single-GPU jobs).

The class: policies whose single-GPU jobs finish, on average, no more than `mean_delay_s` after
submit + duration (waiting to start, waiting to resume after a stop, work redone, and slowing
from sharing all count; for a policy that never stops or slows them it is their mean wait). A
whole-node job's wait is counted, as in `wide_floor.py`, as end - submit - duration (for one
never stopped, its wait to start). Where
every job runs at full pace from its submit (`arrival_s`, delay 0) and every whole-node job takes
whole nodes, the nodes they touch are at least ceil(GPUs held / width) and none of their GPUs is
left (else the GPUs held count, as below). With delays d_j, each job runs less than full pace over
[submit, submit + duration] for at most d_j seconds' worth, so the GPUs freed there total at most
sum a_j d_j <= max a_j x mean_delay_s x jobs GPU-seconds (`budget_node_s` x width), placed
anywhere; each such GPU-second raises the max flow by at most one. So a wait W is out of reach for
the class when the whole-node work that cannot end by its deadline (GPUs held counted
fractionally) exceeds that budget; `joint_s` is the largest W found out of reach, within
`precision_s` of the least in reach (it never exceeds the least max wait of the class). Times are
whole seconds, single-GPU jobs' runs shrunk inward and capacities rounded up: relaxations only.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from benchmarks.floors.wide_floor import max_wait_floor, shortfall, wide_jobs
from scheduler.policy.state import GpuState, allows
from scheduler.sim import CONTENTION_OVERLAP

SCALE = 1000  # the max flow's unit: 1/SCALE GPU-second
PINNED, FLEXIBLE, AWAY = 0, 1, 2  # where a single-GPU job may run: the whole-node jobs' nodes only, both, others only


@dataclass(frozen=True)
class JointFloor:
    alone_s: float  # wide_floor.max_wait_floor: no policy at all beats it
    arrival_s: float  # no policy that runs every single-GPU job at full pace from its submit beats it
    joint_s: float  # no policy whose single-GPU jobs' mean delay is <= mean_delay_s beats it (nor alone_s)
    budget_node_s: float  # the node-seconds that delay can free for the whole-node jobs at most
    fcfs_s: float  # first-come-first-served among the whole-node jobs alone (an upper bound on alone_s)


class Capacity:
    """The GPUs of the nodes the whole-node jobs may use that the single-GPU jobs leave them, over
    time, as a step function; `__call__(lo, hi)`: its integral over [lo, hi] in GPU-seconds x SCALE,
    rounded up. `whole`: a node holding any single-GPU job is lost whole."""

    def __init__(self, trace: list, fleet: list[GpuState], usable: list[str], width: int, whole: bool):
        self.gpus = len(usable) * width
        self.times, lost = _lost_nodes(trace, fleet, set(usable), width, whole)
        self.lost = lost
        self.prefix = [0.0]  # GPU-seconds lost before each time in `times`
        for index in range(1, len(self.times)):
            self.prefix.append(self.prefix[-1] + lost[index - 1] * (self.times[index] - self.times[index - 1]))

    def lost_before(self, t: float) -> float:
        index = bisect.bisect_right(self.times, t) - 1
        return 0.0 if index < 0 else self.prefix[index] + self.lost[index] * (t - self.times[index])

    def __call__(self, lo: float, hi: float) -> int:
        left = self.gpus * (hi - lo) - (self.lost_before(hi) - self.lost_before(lo))
        return max(0, math.ceil(SCALE * left))


def weights(trace: list, fleet: list[GpuState]) -> dict[str, float]:
    """a_j (module docstring) of each single-GPU job: the least share of a GPU it holds per unit of pace."""
    singles = [job for job in trace if job.gpus == 1]
    if not singles:
        return {}
    least = min(job.peak_mem_gib for job in singles)
    if not least > 0:
        raise ValueError(f"joint_floor: a single-GPU job's peak_mem_gib must be positive, got {least}")
    most = max(1, max(math.floor(gpu.total_gib / least) for gpu in fleet))
    per_gpu = min(most, 1 + CONTENTION_OVERLAP * (most - 1))
    return {job.job_id: 1.0 if job.exclusive else min(1.0, job.share) / per_gpu for job in singles}


def _lost_nodes(trace, fleet, usable: set[str], width: int, whole: bool) -> tuple[list[float], list[float]]:
    """(times, GPUs lost from each time to the next): what the single-GPU jobs running at full pace
    from submit hold of the usable nodes, packed (module docstring); whole nodes or fractional GPUs."""
    models = {gpu.node: gpu.model for gpu in fleet}
    elsewhere = sum(1 for gpu in fleet if gpu.node not in usable)  # GPUs off the whole-node jobs' nodes
    weight, changes = weights(trace, fleet), []
    for job in (j for j in trace if j.gpus == 1):
        on = {node in usable for node, model in models.items() if allows(job.models, model)}
        where = FLEXIBLE if on == {True, False} else AWAY if on == {False} else PINNED
        start, end = math.ceil(job.submit_s), math.floor(job.submit_s + job.duration_s)
        if end > start:
            changes += [(start, weight[job.job_id], where), (end, -weight[job.job_id], where)]
    changes.sort(key=lambda change: change[0])
    held, times, lost = [0.0, 0.0, 0.0], [], []
    for index, (when, delta, where) in enumerate(changes):
        held[where] += delta
        if index + 1 < len(changes) and changes[index + 1][0] == when:
            continue
        gpus = max(0.0, held[PINNED] + max(0.0, held[FLEXIBLE] - max(0.0, elsewhere - held[AWAY])))
        held_gpus = width * math.ceil(gpus / width - 1e-9) if whole else gpus
        times.append(float(when))
        lost.append(min(float(len(usable) * width), held_gpus))
    return times, lost


def least_wait(jobs: list, capacity: Capacity, budget: int, precision_s: float, start_s: float) -> float:
    """The largest wait found at which more than `budget` (x SCALE) GPU-seconds of `jobs`' work
    cannot end by its deadline, within `precision_s` of the least at which it can (or 0)."""
    if not jobs or shortfall(jobs, 0.0, capacity, SCALE) <= budget:
        return 0.0
    lo, hi = 0.0, max(start_s, precision_s)
    for _ in range(64):  # past the last single-GPU job every node is free: some wait passes
        if shortfall(jobs, hi, capacity, SCALE) <= budget:
            break
        lo, hi = hi, 2 * hi
    else:
        raise RuntimeError("joint_floor: no wait lets the whole-node jobs end (a job wider than the nodes left?)")
    while hi - lo > precision_s:
        middle = (lo + hi) / 2
        lo, hi = (lo, middle) if shortfall(jobs, middle, capacity, SCALE) <= budget else (middle, hi)
    return lo


def joint_floor(trace: list, fleet: list[GpuState], mean_delay_s: float = 300.0, precision_s: float = 60.0) -> JointFloor:
    """The floors (module docstring) for `trace`'s whole-node jobs on `fleet`, single-GPU jobs' mean
    delay at most `mean_delay_s`."""
    if not (math.isfinite(mean_delay_s) and mean_delay_s >= 0):
        raise ValueError(f"joint_floor: mean_delay_s must be finite and >= 0, got {mean_delay_s}")
    alone = max_wait_floor(trace, fleet, precision_s)
    jobs, usable, width = _wide_gpus(trace, fleet)
    weight = weights(trace, fleet)
    budget = max(weight.values(), default=0.0) * mean_delay_s * len(weight)  # GPU-seconds
    start = max(alone.fcfs_s, 3600.0)
    arrival = 0.0
    if all(gpus % width == 0 for *_, gpus in jobs):  # whole nodes: a node with a single-GPU job is lost
        arrival = least_wait(jobs, Capacity(trace, fleet, usable, width, whole=True), 0, precision_s, start)
    fractional = Capacity(trace, fleet, usable, width, whole=False)
    arrival = max(arrival, least_wait(jobs, fractional, 0, precision_s, start))
    joint = least_wait(jobs, fractional, math.floor(SCALE * budget), precision_s, start)
    floor = alone.floor_s
    return JointFloor(floor, max(arrival, floor), max(joint, floor), budget / max(width, 1), alone.fcfs_s)


def lacking_node_s(trace: list, fleet: list[GpuState], wait_s: float) -> float:
    """The node-seconds of whole-node work that cannot end by submit + duration + `wait_s` beside
    single-GPU jobs at full pace from submit (GPUs held counted fractionally): what delay must free."""
    jobs, usable, width = _wide_gpus(trace, fleet)
    return shortfall(jobs, wait_s, Capacity(trace, fleet, usable, width, whole=False), SCALE) / SCALE / max(width, 1)


def _wide_gpus(trace: list, fleet: list[GpuState]) -> tuple[list[tuple[float, float, int]], list[str], int]:
    """`wide_floor.wide_jobs` with each job's GPUs in place of the nodes it needs."""
    _, usable, width = wide_jobs(trace, fleet)
    wide = sorted((j for j in trace if 2 * j.gpus > width), key=lambda j: (j.submit_s, j.job_id))
    return [(j.submit_s, j.duration_s, j.gpus) for j in wide], usable, width
