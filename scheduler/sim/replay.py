"""The trace replay with its accounting kept as it goes: the same model and measures as
`scheduler/sim/reference.py`'s reference loop, at a cost per event that does not grow with the
fleet or the number of running jobs.

The reference loop recomputes, at every event, every running job's pace, the next finish, the
busy GPUs and the allocated memory, and passes the policy every waiting job, GPU and running
job. Here the drape policy is a `Planner` (`scheduler/policy/planner.py`) that keeps its state, and:

- each job's progress is (work left, pace, since when); a job's pace is recomputed only when a
  GPU it runs on gains or loses a job, and its projected finish sits in a heap (an entry whose
  pace changed since is skipped), so the next finish is the heap's top;
- the busy GPUs and the allocated memory are running totals, changed by the GPUs a start or an
  end touches; the next time a waiting multi-GPU job may preempt is the first of a sorted list.

Progress is the same model, summed in another order: a job's work left is its work less pace ×
time since its pace last changed, not less each event's share, so times agree with the
reference loop's to rounding (about 1e-9 s; `tests/unit/test_planner.py` compares both).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from sortedcontainers import SortedList

from scheduler.policy.checkpoints import waited_wake
from scheduler.policy.planner import Planner
from scheduler.policy.state import GpuState, JobRequest, Placement, PolicyConfig, bound_start, queued_at
from scheduler.sim.model import Tally, check_fits, never_placed, pace, request_of, requeued, sim_result

Record = list[tuple[float, str, tuple[str, ...], tuple[str, ...]]]  # (time, job, GPUs, evicted jobs)


@dataclass
class _Progress:
    remaining: float  # work left at `since` (s of work at full pace)
    pace: float
    since: float
    version: int = 0

    def left(self, clock: float) -> float:
        return self.remaining - self.pace * (clock - self.since)


class _Replay:
    """One replay's state: the planner (the fleet and the queue), progress and the running totals."""

    def __init__(self, fleet: list[GpuState], config: PolicyConfig, measured_shared: dict[str, bool]):
        self.planner = Planner([GpuState(g.uuid, g.node, g.model, g.total_gib, solo=g.solo) for g in fleet], config)
        self.config, self.measured_shared = config, measured_shared
        self.progress: dict[str, _Progress] = {}
        self.finishes: list[tuple[float, int, str]] = []  # (projected finish, version, job)
        self.busy_gpus, self.allocated_gib = 0, 0.0
        self.versions = 0  # the last progress version handed out
        self.wakes = SortedList()  # (submit + patience, job) of waiting multi-GPU jobs
        self.requests: dict[str, JobRequest] = {}  # running job → the request it started from
        self.gang_waits = SortedList()  # running multi-GPU jobs' waits at their starts (`gang_stops_waited`)

    def submit(self, request: JobRequest) -> None:
        self.planner.submit(request)
        for wake in self._wakes(request):
            self.wakes.add((wake, request.id))

    def _wakes(self, request: JobRequest) -> list[float]:
        """When waiting multi-GPU `request` may first preempt: to move jobs, and to stop them. With
        `gang_bound_backlog` the bound rises with the backlog, so the bound as set is no time to wake
        (a pass there would plan where the reference loop does not): `next_wake` asks the planner."""
        if request.gpus <= 1:
            return []
        bound = None if self.config.gang_bound_backlog else self.config.gang_max_wait_s
        since = bound_start(request, self.config)
        starts = ((self.config.preempt_after_s, queued_at(request)), (bound, since), (self.config.gang_stops_waited, since))
        return [start + limit for limit, start in starts if limit is not None]

    def next_wake(self, clock: float) -> float:
        """The next time past `clock` a waiting gang job may preempt: its limits as set, and with
        `gang_bound_backlog` its bound as the backlog now stands (`Planner.next_overdue`)."""
        position = self.wakes.bisect_right((clock, "\uffff"))
        wake = self.wakes[position][0] if position < len(self.wakes) else float("inf")
        if self.config.gang_stops_waited is not None:  # a wait passing a running gang job's by the gap
            starts = (since for since, _ in self.planner.gang_submits)
            wake = min(wake, waited_wake(starts, self.gang_waits, self.config, clock))
        return min(wake, self.planner.next_overdue(clock)) if self.config.gang_bound_backlog else wake

    def next_finish(self) -> float:
        while self.finishes:
            finish, version, job_id = self.finishes[0]
            if job_id in self.progress and self.progress[job_id].version == version:
                return finish
            heapq.heappop(self.finishes)
        return float("inf")

    def _settle(self, uuids: tuple[str, ...], clock: float) -> None:
        """Bring the progress of every job on `uuids` up to `clock` at its pace so far."""
        for uuid in uuids:
            for job in self.planner.on_gpu.get(uuid, ()):
                state = self.progress[job.id]
                state.remaining, state.since = state.left(clock), clock

    def _repace(self, uuids: tuple[str, ...], clock: float) -> None:
        seen: set[str] = set()
        for uuid in uuids:
            for job in self.planner.on_gpu.get(uuid, ()):
                if job.id in seen or self.measured_shared[job.id]:
                    continue
                seen.add(job.id)
                state = self.progress[job.id]
                self.versions += 1  # unique over the replay: a job started again must not match its old entries
                state.pace, state.version = min(pace(self.planner.gpus[u]) for u in job.gpus), self.versions
                heapq.heappush(self.finishes, (clock + state.remaining / state.pace, state.version, job.id))

    def _totals(self, uuids: tuple[str, ...], sign: int) -> None:
        for uuid in uuids:
            gpu = self.planner.gpus[uuid]
            self.busy_gpus += sign * (gpu.jobs > 0)
            self.allocated_gib += sign * gpu.allocated_gib

    def start(self, placement: Placement, clock: float) -> JobRequest:
        request = self.planner.pending[placement.job_id]
        self._settle(placement.gpus, clock)
        self._totals(placement.gpus, -1)
        started = self.planner.start(placement, clock)
        if len(started.gpus) > 1:
            self.gang_waits.add(started.waited_s)
        self._totals(placement.gpus, +1)
        for wake in self._wakes(request):
            self.wakes.discard((wake, request.id))
        self.requests[request.id] = request  # as it started: a preemption charges from its duration
        self.versions += 1
        self.progress[request.id] = _Progress(request.duration_s, 1.0, clock, self.versions)
        heapq.heappush(self.finishes, (clock + request.duration_s, self.versions, request.id))
        self._repace(placement.gpus, clock)
        return request

    def stop(self, job_id: str, clock: float) -> tuple[tuple[str, ...], float, JobRequest]:
        """End running job `job_id` at `clock`: its GPUs, the work it had left, its request."""
        job = self.planner.running[job_id]
        gpus = job.gpus
        if len(gpus) > 1:
            self.gang_waits.remove(job.waited_s)
        self._settle(gpus, clock)
        self._totals(gpus, -1)
        self.planner.finish(job_id)
        self._totals(gpus, +1)
        left = self.progress.pop(job_id).remaining
        self._repace(gpus, clock)
        return gpus, left, self.requests.pop(job_id)

    def finished(self, clock: float) -> list[str]:
        """The jobs whose work is done at `clock` (left ≤ 1e-6 s), in the order they started."""
        done: list[tuple[float, int, str]] = []
        later: list[tuple[float, int, str]] = []
        while self.finishes and self.finishes[0][0] <= clock + 1e-3:  # a pace is at least 1e-3 × full
            entry = heapq.heappop(self.finishes)
            state = self.progress.get(entry[2])
            if state is not None and state.version == entry[1]:
                (done if state.left(clock) <= 1e-6 else later).append(entry)
        for entry in later:
            heapq.heappush(self.finishes, entry)
        return sorted((job_id for *_, job_id in done), key=self.planner.number.__getitem__)


def replay(
    trace,
    fleet: list[GpuState],
    config: PolicyConfig,
    record: Record | None = None,
    plan: Callable | None = None,
    watch: Callable[[Planner, float], None] | None = None,
):
    """Replay `trace` on `fleet` under the drape policy (`plan`: a stateless policy function in the
    planner's place, to compare with; `watch(planner, now)`: called before each event's planning,
    to look at the state); a `SimResult` as `simulate` returns."""
    check_fits(trace, fleet, config.span_nodes)
    state = _Replay(fleet, config, {j.job_id: j.measured == "shared" for j in trace})
    planner, by_id, tally = state.planner, {j.job_id: j for j in trace}, Tally()
    clock, arrival, busy, allocated = trace[0].submit_s if trace else 0.0, 0, 0.0, 0.0
    finish_last = clock
    while arrival < len(trace) or planner.pending or planner.running:
        # 1. advance the clock to the next finish, arrival or time a waiting gang job may preempt
        upcoming = min(
            state.next_finish(), state.next_wake(clock), trace[arrival].submit_s if arrival < len(trace) else float("inf")
        )
        if upcoming == float("inf"):
            raise never_placed("drape", planner.pending.values())
        busy += (upcoming - clock) * state.busy_gpus
        allocated += (upcoming - clock) * state.allocated_gib
        clock = upcoming
        # 2. finished jobs free their GPUs; arrivals join the queue
        for job_id in state.finished(clock):
            state.stop(job_id, clock)
            tally.finished(by_id[job_id], clock)
            finish_last = clock
        while arrival < len(trace) and trace[arrival].submit_s <= clock:
            state.submit(request_of(trace[arrival]))
            arrival += 1
        # 3. the policy places what it can; preempted jobs are planned again at once
        if watch is not None:
            watch(planner, clock)
        for _ in range(4):
            if plan is None:
                placements = planner.plan(clock)
            else:
                pending, gpus, running = (
                    list(planner.pending.values()),
                    list(planner.gpus.values()),
                    list(planner.running.values()),
                )
                placements = plan(pending, gpus, running, clock, config)
            if not _apply(placements, state, by_id, clock, tally, record):
                break
    return sim_result("drape", trace, planner.gpus, busy, allocated, finish_last, tally)


def _apply(placements: list[Placement], state: _Replay, by_id: dict, clock: float, tally, record: Record | None) -> bool:
    """`reference._apply` on the replay's state: evict, start, count; True when any job was preempted."""
    evicted = False
    for placement in placements:
        for victim in placement.evicts:
            began = state.planner.running[victim].started_s
            gpus, left, request = state.stop(victim, clock)
            again, lost = requeued(request, left, began, clock)
            state.submit(again)
            tally.preemptions, tally.lost_gpu_s, evicted = tally.preemptions + 1, tally.lost_gpu_s + lost * len(gpus), True
            tally.preempted_at[victim] = clock
        request = state.start(placement, clock)
        if record is not None:
            record.append((clock, placement.job_id, placement.gpus, placement.evicts))
        tally.started(by_id[placement.job_id], request, placement.gpus, state.planner.gpus, clock)
    return evicted
