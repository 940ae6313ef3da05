"""The drape policy as a planner that lives as long as the fleet: the same decisions as
`plan_drape` (`scheduler/policy/plan.py`, kept as the reference), at a cost per decision that grows
with the logarithm of the fleet and the queue instead of with their size.

`plan_drape` is a pure function of (waiting jobs, GPUs, running jobs, now): each call copies
every GPU, indexes them, sorts every waiting job and lists every running one. A `Planner` keeps
all of that and is told what changes:

- `submit` / `withdraw`: a job joins or leaves the queue. The queue is kept in the policy's
  order: effective priority = priority + aging × (now − submit) / 3600 orders jobs as
  priority − aging × submit / 3600 does at every `now` past their submits, so the order is
  kept, never re-sorted (`static_priority`);
- `start` / `finish`: a job takes or leaves its GPUs; the fleet's indexes (`scheduler/policy/pool.py`),
  the running jobs by GPU and by expected end, and the workload's shapes follow;
- `plan(now)`: one planning pass. It changes the indexes as `plan_drape` changes its copy (each
  placement takes its GPUs for the jobs after it) and puts them back when it returns
  (`Pool.begin` / `rollback`): what it decides is only what the caller then starts.

Within a pass, a job shape that found no GPUs finds none later in the pass (placements only take
room), so later jobs of that shape are not looked at again; the reservation walks the running
jobs from the soonest expected end and stops where the head fits (`reserve_walk`); spreading
looks only at GPUs that are crowded. The equivalence with `plan_drape` is tested by replaying
traces both ways and comparing every placement (`tests/unit/test_planner.py`).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from scheduler.policy.checkpoints import backlog_s, gang_bound, overdue, work_of
from scheduler.policy.clearing import Clearing
from scheduler.policy.fragmentation import widths_of_shapes
from scheduler.policy.pool import Pool
from scheduler.policy.preemption import Preemptor, preempt, spread, starves
from scheduler.policy.reservation import Reservation, earlier, reserve_span, reserve_walk
from scheduler.policy.scarcity import rescue, scarce_kinds
from scheduler.policy.state import (
    GpuState,
    JobRequest,
    Placement,
    PolicyConfig,
    RunningJob,
    bound_start,
    static_priority,
    waited_by,
)
from scheduler.policy.victims import Victims


class Planner:
    """The drape policy over a fleet it keeps indexed (see the module docstring). It owns `gpus`:
    change them only through `start` and `finish`."""

    def __init__(self, gpus: list[GpuState], config: PolicyConfig = PolicyConfig()):
        self.config = config
        self.gpus = {g.uuid: g for g in gpus}
        self.pool = Pool(self.gpus, config)
        self.nodes: dict[str, list[str]] = {}
        for gpu in gpus:
            self.nodes.setdefault(gpu.node, []).append(gpu.uuid)
        self.pending: dict[str, JobRequest] = {}
        self.order = SortedList()  # (−static priority, submit, id): the policy's order at any now
        self.queues: dict[tuple, SortedList] = {}  # the same, per job shape (gang jobs: per priority too)
        self.gang_submits = SortedList()  # (since when queued, id) of waiting multi-GPU jobs
        self.work = 0  # the waiting jobs' work (`checkpoints.work_of`): the backlog the gang bound may rise with
        self.running: dict[str, RunningJob] = {}
        self.alone: dict[str, tuple[float, bool]] = {}  # job → (declared share, runs alone)
        self.on_gpu: dict[str, list[RunningJob]] = {}
        self.by_end = SortedList()  # (expected end, start number, id) of running jobs
        self.started = 0
        self.number: dict[str, int] = {}
        self.shapes: Counter[tuple[int, float]] = Counter()  # (GPUs, GiB) of waiting and running jobs
        self.constrained: Counter[tuple[str, ...]] = Counter()  # the models named by waiting jobs
        self.of_kind: dict[tuple[str, float], list[str]] = {}  # GPU kind → its GPUs
        for gpu in sorted(gpus, key=lambda g: g.uuid):
            self.of_kind.setdefault((gpu.model, gpu.total_gib), []).append(gpu.uuid)
        self.clearing = Clearing(self)  # when each node clears: multi-GPU jobs' reservations
        self.victims = Victims(self)  # where a starving multi-GPU job may preempt

    # -- what changes ----------------------------------------------------------------------------

    def submit(self, job: JobRequest) -> None:
        if job.id in self.pending or job.id in self.running:
            raise ValueError(f"job {job.id!r} is already queued or running")
        self.pending[job.id] = job
        self.order.add(self._key(job))
        self.queues.setdefault(_shape(job), SortedList()).add(self._key(job))
        if job.gpus > 1:
            self.gang_submits.add((self._waits_from(job), job.id))
        self.shapes[(job.gpus, job.mem_gib)] += 1
        self.constrained[job.models] += 1
        self.work += work_of(job)

    def submit_many(self, jobs: list[JobRequest]) -> None:
        """`submit` each of `jobs` (a whole queue read at once): each order sorted once, not job by job."""
        keys: dict[tuple, list] = {}
        for job in jobs:
            if job.id in self.pending or job.id in self.running:
                raise ValueError(f"job {job.id!r} is already queued or running")
            self.pending[job.id] = job
            keys.setdefault(_shape(job), []).append(self._key(job))
            self.shapes[(job.gpus, job.mem_gib)] += 1
            self.constrained[job.models] += 1
            self.work += work_of(job)
        self.order.update(key for shape_keys in keys.values() for key in shape_keys)
        for shape, shape_keys in keys.items():
            self.queues.setdefault(shape, SortedList()).update(shape_keys)
        self.gang_submits.update((self._waits_from(job), job.id) for job in jobs if job.gpus > 1)

    def backlog(self) -> float:
        """The queue's backlog (s): the waiting jobs' work over the fleet's GPUs (`checkpoints.backlog_s`)."""
        return backlog_s(self.work, len(self.gpus))

    def next_overdue(self, after: float) -> float:
        """The first time past `after` a waiting gang job becomes overdue, the backlog as it stands (it
        changes only when the queue does, and a pass follows each change); inf when none will."""
        bound = gang_bound(self.config, self.backlog())
        if bound is None:
            return float("inf")
        for since, _ in self.gang_submits.islice(self.gang_submits.bisect_left((after - bound,))):
            if since + bound > after:
                return since + bound
        return float("inf")

    def _waits_from(self, job: JobRequest) -> float:
        """The earliest a gang job's limits count from: `bound_start`, never after its requeue (from
        which `preempt_after_s` counts). The longest-waiting one decides whether a pass looks for
        jobs to preempt."""
        return bound_start(job, self.config)

    def withdraw(self, job_id: str) -> JobRequest:
        job = self.pending.pop(job_id)
        self.order.remove(self._key(job))
        queue = self.queues[_shape(job)]
        queue.remove(self._key(job))
        if not queue:
            del self.queues[_shape(job)]
        if job.gpus > 1:
            self.gang_submits.remove((self._waits_from(job), job.id))
        self._count((job.gpus, job.mem_gib), -1)
        self._constrained(job.models, -1)
        self.work -= work_of(job)
        return job

    def start(self, placement: Placement, now: float) -> RunningJob:
        """The waiting job of `placement` takes its GPUs at `now` (after its evictions `finish`ed)."""
        request = self.withdraw(placement.job_id)
        alone = len(placement.gpus) > 1 or request.exclusive
        expected_end = now + request.duration_s
        job = RunningJob(
            request.id,
            placement.gpus,
            placement.mem_gib,
            expected_end,
            request.priority,
            not alone,
            request.preempted,
            request.models,
            request.share,  # a moved job keeps its declared share (`preemption.spread`, `scarcity`)
            preemptible=request.preemptible and not request.exclusive,
            checkpoint_every_s=request.checkpoint_every_s,
            started_s=now,
            waited_s=waited_by(request, now),
        )
        for uuid in placement.gpus:
            gpu = self.pool.detach(uuid)
            gpu.jobs += 1
            gpu.allocated_gib += placement.mem_gib
            gpu.shares += request.share
            gpu.exclusive = alone or gpu.solo
            self.pool.attach(uuid)
            self.on_gpu.setdefault(uuid, []).append(job)
            self.pool.ends[uuid] = max(self.pool.ends.get(uuid, expected_end), expected_end)
        self.running[job.id], self.alone[job.id] = job, (request.share, alone)
        self.number[job.id], self.started = self.started, self.started + 1
        self.by_end.add((expected_end, self.number[job.id], job.id))
        self.shapes[(len(job.gpus), job.mem_gib)] += 1
        self._refresh(job)
        return job

    def finish(self, job_id: str) -> RunningJob:
        """Running job `job_id` ended (or was preempted): its GPUs are freed."""
        job = self.running.pop(job_id)
        share, alone = self.alone.pop(job_id)
        for uuid in job.gpus:
            gpu = self.pool.detach(uuid)
            gpu.jobs -= 1
            gpu.shares = gpu.shares - share if gpu.jobs else 0.0
            gpu.exclusive = gpu.exclusive and not alone
            gpu.allocated_gib = gpu.allocated_gib - job.mem_gib if gpu.jobs else 0.0
            self.pool.attach(uuid)
            left = self.on_gpu[uuid]
            left.remove(job)
            if left:
                self.pool.ends[uuid] = max(other.expected_end_s for other in left)
            else:
                del self.on_gpu[uuid]
                self.pool.ends.pop(uuid, None)
        self.by_end.remove((job.expected_end_s, self.number.pop(job_id), job_id))
        self._count((len(job.gpus), job.mem_gib), -1)
        self._refresh(job)
        return job

    def observe(self, uuid: str, used_gib: float | None, util: float | None) -> None:
        """DCGM's latest reading of GPU `uuid` (framebuffer used, utilization %; None: unknown):
        a live dispatcher's fleet view each cycle, changing only the GPUs whose reading moved."""
        gpu = self.gpus[uuid]
        if (gpu.observed_used_gib, gpu.observed_util) == (used_gib, util):
            return
        self.pool.detach(uuid)
        gpu.observed_used_gib, gpu.observed_util = used_gib, util
        self.pool.attach(uuid)
        self.clearing.refresh(gpu.node)
        self.victims.refresh(gpu.node)

    def _refresh(self, job: RunningJob) -> None:
        for node in {self.gpus[uuid].node for uuid in job.gpus}:
            self.clearing.refresh(node)
            self.victims.refresh(node)

    def _key(self, job: JobRequest) -> tuple[float, float, str]:
        return (-static_priority(job, self.config), job.submit_s, job.id)

    def _constrained(self, models: tuple[str, ...], change: int) -> None:
        self.constrained[models] += change
        if not self.constrained[models]:
            del self.constrained[models]

    def _count(self, shape: tuple[int, float], change: int) -> None:
        self.shapes[shape] += change
        if not self.shapes[shape]:
            del self.shapes[shape]

    # -- a planning pass -------------------------------------------------------------------------

    def plan(self, now: float) -> list[Placement]:
        """Placements to start now under the drape policy: `plan_drape`'s, from the kept state."""
        pool, config = self.pool, self.config
        pool.begin(now)
        if config.fragmentation:
            pool.set_widths(widths_of_shapes(self.shapes, pool.sizes, pool.most))
        pool.avoid = scarce_kinds(self.constrained, self.of_kind) if config.avoid_scarce else frozenset()
        try:
            placements, reservation, blocked = self._place(now)
            moves = self._rescue(blocked, reservation, placements, now)
            return placements + moves + self._spread(placements, reservation, now)
        finally:
            pool.rollback()

    def _rescue(
        self, blocked: list[JobRequest], reservation: Reservation | None, placements: list[Placement], now: float
    ) -> list[Placement]:
        """Moves of long unconstrained jobs off the GPUs waiting constrained jobs need (`scarcity.py`)."""
        if not blocked or not self.pool.avoid:
            return []

        def gpus_of(job: JobRequest) -> list[str]:
            return [uuid for kind, uuids in self.of_kind.items() if self.pool._kind_ok(job, kind) for uuid in uuids]

        exclude = reservation.gpus if reservation is not None else frozenset()
        evicted = frozenset(victim for p in placements for victim in p.evicts)
        return rescue(blocked, self.pool, gpus_of, lambda uuid: self.on_gpu.get(uuid, []), now, exclude, evicted)

    def _place(self, now: float) -> tuple[list[Placement], Reservation | None, list[JobRequest]]:
        """`plan_drape`'s loop over the waiting jobs in order, one queue per shape merged by key: a
        shape whose job found nothing is left (its later jobs would find nothing either), so a
        pass looks at the jobs it places and one more per shape, not at the whole queue."""
        waited = now - self.gang_submits[0][0] if self.gang_submits else -1.0  # the longest a gang job waits
        backlog = self.backlog()
        limits = (self.config.preempt_after_s, gang_bound(self.config, backlog))
        starving = any(limit is not None and waited >= limit for limit in limits)
        if not starving and self.gang_submits and self.config.gang_stops_waited is not None:
            starving = overdue(self.pending[self.gang_submits[0][1]], now, self.config, backlog)  # the longest waiting
        preemptor = Preemptor([], self.config, on_gpu=self.on_gpu, victims=self.victims, backlog=backlog) if starving else None
        step = _Pass(now, preemptor)
        heap = []
        for shape, queue in self.queues.items():
            jobs = iter(queue)
            heap.append((next(jobs), shape, jobs))
        heapq.heapify(heap)
        while heap:
            key, shape, jobs = heap[0]
            action = self._decide(self.pending[key[-1]], step)
            if action == _STOP:
                break
            following = next(jobs, None) if action == _NEXT else None
            if following is not None:
                heapq.heapreplace(heap, (following, shape, jobs))
            else:
                heapq.heappop(heap)
        return step.placements, (None if step.reservation is _NOWHERE else step.reservation), list(step.blocked.values())

    def _decide(self, job: JobRequest, step: _Pass) -> int:
        """One job of the pass, as `plan_drape`'s loop body: place it (or not); what to do next."""
        pool, config, now = self.pool, self.config, step.now
        if not pool.idle and not pool.shared:
            if step.preemptor is None:
                return _STOP  # nothing can start until something ends
            if job.gpus == 1:
                return _DROP  # only a starving multi-GPU job can start, by preempting
        shape = (job.gpus, job.mem_gib, job.models, job.exclusive, job.share, job.prefer_node)
        held = step.held.get(shape)
        if held is not None and held == pool.changes and now + job.duration_s > step.reservation.time_s:  # type: ignore[union-attr]
            return _NEXT  # as the last job of its shape: its GPUs are reserved, none off them, nothing changed since
        choice = None if shape in step.dead else pool.best_fit(job)
        if choice is None:
            step.dead.add(shape)
            if job.models and config.avoid_scarce:
                step.blocked.setdefault(shape, job)  # a constrained job: unconstrained ones may move off its GPUs
            starving = step.preemptor is not None and (
                starves(job, now, config) or overdue(job, now, config, step.preemptor.backlog)
            )
            if starving and (taken := preempt(step.preemptor, job, pool, now)):  # type: ignore[arg-type]
                pool.empty(taken[0])
                pool.take(taken[0], job)
                step.placements.append(Placement(job.id, taken[0], job.mem_gib, taken[1]))
                return _NEXT
            if not config.backfill:
                return _STOP
            if step.reservation is None:  # the first job that cannot start: once a pass, as `plan_drape`
                if job.gpus > 1:
                    found = self.clearing.reserve(job, step.placements, now)
                    if config.span_nodes:  # or across nodes, if that is sooner
                        spanned = reserve_span(job, pool.gpus, self._ending(step.placements, now), now, pool.most)
                        found = earlier(found, spanned)
                else:
                    found = reserve_walk(job, pool.gpus, self.nodes, self._ending(step.placements, now), now, config)
                step.reservation = found or _NOWHERE
            # the shape's later jobs find nothing either: looked at only while one may still preempt
            return _NEXT if step.preemptor is not None and step.preemptor.shape_may(job, now, starving) else _DROP
        reservation = step.reservation
        if reservation is not None and now + job.duration_s > reservation.time_s and set(choice) & reservation.gpus:
            off = (*shape, "off")
            choice = None if off in step.dead else pool.best_fit(job, exclude=reservation.gpus)
            if choice is None:
                step.dead.add(off)
                step.held[shape] = pool.changes
                return _NEXT
        pool.take(choice, job)
        step.placements.append(Placement(job.id, choice, job.mem_gib))
        return _NEXT

    def _ending(self, placements: list[Placement], now: float) -> Iterator[RunningJob]:
        """The running jobs and this pass's placements by expected end (ties: the order they started)."""
        running = (self.running[job_id] for _, _, job_id in self.by_end)
        placed = sorted(
            (RunningJob(p.job_id, p.gpus, p.mem_gib, now + self.pending[p.job_id].duration_s) for p in placements),
            key=lambda r: r.expected_end_s,
        )
        return heapq.merge(running, placed, key=lambda r: r.expected_end_s)

    def _spread(self, placements: list[Placement], reservation: Reservation | None, now: float) -> list[Placement]:
        """`plan_drape`'s `_spread`, looking only at the running jobs on crowded GPUs."""
        config, pool = self.config, self.pool
        if config.spread_after_s is None or not pool.idle:
            return []
        crowded = [job for uuid in pool.crowded for job in self.on_gpu.get(uuid, ())]
        if len(self.gang_submits) == sum(1 for p in placements if len(p.gpus) > 1):  # no gang job waits
            return spread(pool, crowded, now, config)
        if reservation is not None:
            return spread(pool, crowded, now, config, exclude=reservation.gpus)
        return []


def _shape(job: JobRequest) -> tuple:
    """What decides where a job fits (a gang job's priority too: whether it may preempt)."""
    return (job.gpus, job.mem_gib, job.models, job.exclusive, job.share, job.prefer_node, job.priority if job.gpus > 1 else None)


_NOWHERE = Reservation(float("inf"), frozenset())  # a head that fits nowhere, as things stand
_NEXT, _DROP, _STOP = 0, 1, 2  # after a job: its shape's next job, none of its shape, no job at all


@dataclass
class _Pass:
    """What one planning pass has decided so far."""

    now: float
    preemptor: Preemptor | None
    placements: list[Placement] = field(default_factory=list)
    reservation: Reservation | None = None
    dead: set[tuple] = field(default_factory=set)  # shapes (and shapes off the reservation) that found nothing
    held: dict[tuple, int] = field(default_factory=dict)  # shapes that fit only on reserved GPUs, as of pool change n
    blocked: dict[tuple, JobRequest] = field(default_factory=dict)  # per shape, the first constrained job that found no GPUs
