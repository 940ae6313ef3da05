"""The dispatcher's planner, kept in step with the queue's database between cycles.

`plan_drape` is handed every waiting and running job each cycle, read whole from the database;
at 100,000 queued jobs the reads and the conversions cost more than the planning. A `LivePlanner`
keeps one `Planner` (`scheduler/policy/planner.py`) for the dispatcher's life and each cycle reads only
the jobs whose state changed since the last (`scheduler/queue/versions.py`): a job queued, withdrawn
(cancelled, failed, claimed by a rival dispatcher), started or ended is told to the planner as
submit / withdraw / start / finish. The planner then decides what `plan_drape` would over the
same jobs and GPUs (`tests/unit/test_live_planner.py` runs a dispatcher both ways).

It reads everything again (`rebuild`) on its first cycle, when the fleet changes (GPUs added,
removed or resized), when the dispatcher adopted or requeued jobs, when more jobs changed than
`limit`, and when a change does not fit what the planner holds (a start on GPUs it does not know).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from sortedcontainers import SortedList

from scheduler.policy.planner import Planner
from scheduler.policy.state import STARVED_AFTER_S, GpuState, JobRequest, Placement, PolicyConfig
from scheduler.queue.schema import job_request
from scheduler.queue.versions import change_cursor, changed_jobs, live_jobs

CHANGES_LIMIT = 20_000  # more changed jobs than this in one cycle: read the queue whole
ENDED_EVERY = 30  # cycles between counts of the ended jobs (a count over the queue's whole history)


def _request(row: tuple) -> JobRequest:
    job_id, _, priority, submit_s, gpus, mem_gib, duration_s, labels, _, _ = row
    return job_request((job_id, priority, submit_s, gpus, mem_gib, duration_s, labels))


def _placement(row: tuple) -> tuple[Placement, float]:
    """A running job's row as the placement it holds and when it started."""
    job_id, *_, mem_gib, _, _, assigned, start_s = row
    return Placement(job_id, tuple(json.loads(assigned or "[]")), mem_gib), start_s or 0.0


class LivePlanner:
    """A `Planner` over the fleet and the queue's jobs, read incrementally (see the module docstring)."""

    def __init__(self, engine, config: PolicyConfig, limit: int = CHANGES_LIMIT):
        self.engine, self.config, self.limit = engine, config, limit
        self.planner: Planner | None = None
        self.cursor = 0
        self.fleet_key: tuple = ()
        self.waiting = SortedList()  # (submit, id) of the queued jobs: the oldest waits, the overdue
        self.rebuilds = 0
        self.stale = True
        self.ended: dict[str, int] = {}  # succeeded, failed, cancelled → jobs, as last counted
        self.cycles = 0

    def plan(self, gpus: list[GpuState], now: float) -> list[Placement]:
        """What to start now: the planner brought up to date with the database and `gpus` (the fleet
        view; its DCGM readings are applied, its allocations are the planner's own)."""
        planner = self.sync(gpus)
        for gpu in gpus:
            planner.observe(gpu.uuid, gpu.observed_used_gib, gpu.observed_util)
        return planner.plan(now)

    def sync(self, gpus: list[GpuState]) -> Planner:
        """The planner, with the changes since the last cycle applied (or rebuilt)."""
        key = tuple((g.uuid, g.node, g.model, g.total_gib, g.solo) for g in gpus)
        if self.planner is None or self.stale or key != self.fleet_key:
            return self.rebuild(gpus, key)
        cursor = change_cursor(self.engine)
        rows = changed_jobs(self.engine, self.cursor, self.limit)
        if rows is None:
            return self.rebuild(gpus, key)
        try:
            self._apply(self.planner, rows)
        except (KeyError, ValueError):  # a state the planner cannot follow: read everything
            return self.rebuild(gpus, key)
        except BaseException:  # anything else, an interrupt too: marked, then raised
            self.stale = True  # half applied: the next cycle reads everything
            raise
        self.cursor = cursor
        return self.planner

    def rebuild(self, gpus: list[GpuState], key: tuple) -> Planner:
        """A new planner from every queued and running job (the cursor read first: nothing is missed)."""
        self.cursor = change_cursor(self.engine)
        planner = Planner([GpuState(g.uuid, g.node, g.model, g.total_gib, solo=g.solo) for g in gpus], self.config)
        self.planner, self.waiting, self.fleet_key, self.stale = planner, SortedList(), key, False
        self.rebuilds += 1
        queued = [_request(row) for row in live_jobs(self.engine, "queued")]
        planner.submit_many(queued)
        self.waiting.update((job.submit_s, job.id) for job in queued)
        for row in sorted(live_jobs(self.engine, "running"), key=lambda r: (r[9] or 0.0, r[0])):
            self._run(planner, row)
        return planner

    def _apply(self, planner: Planner, rows: list[tuple]) -> None:
        """Set each job of `rows` to the state its row says: first what leaves (GPUs freed), then what comes."""
        for row in rows:
            job_id, state = row[0], row[1]
            if job_id in planner.pending and (state != "queued" or planner.pending[job_id] != _request(row)):
                self._withdraw(planner, job_id)
            elif job_id in planner.running and (state != "running" or self._moved(planner, row)):
                planner.finish(job_id)
        for row in sorted(rows, key=lambda r: (r[9] or 0.0, r[0])):
            job_id, state = row[0], row[1]
            if state == "queued" and job_id not in planner.pending:
                self._submit(planner, _request(row))
            elif state == "running" and job_id not in planner.running:
                self._run(planner, row)

    @staticmethod
    def _moved(planner: Planner, row: tuple) -> bool:
        placement, start_s = _placement(row)
        job = planner.running[row[0]]
        return job.gpus != placement.gpus or job.expected_end_s != start_s + row[6]

    def _run(self, planner: Planner, row: tuple) -> None:
        """Running job `row` holds its GPUs in the planner (on GPUs the view lacks: nowhere, as
        `fleet_view` leaves them out of the GPUs `plan_drape` sees)."""
        placement, start_s = _placement(row)
        if placement.job_id in planner.pending:
            self._withdraw(planner, placement.job_id)
        if placement.gpus and all(uuid in planner.gpus for uuid in placement.gpus):
            self._submit(planner, _request(row))
            self._start(planner, placement, start_s)

    def _submit(self, planner: Planner, job: JobRequest) -> None:
        planner.submit(job)
        self.waiting.add((job.submit_s, job.id))

    def _withdraw(self, planner: Planner, job_id: str) -> None:
        job = planner.withdraw(job_id)
        self.waiting.remove((job.submit_s, job.id))

    def _start(self, planner: Planner, placement: Placement, start_s: float) -> None:
        job = planner.pending[placement.job_id]
        planner.start(placement, start_s)
        self.waiting.remove((job.submit_s, job.id))

    # -- what the dispatcher reports on the waiting jobs -------------------------------------

    def candidates(self, now: float, timeout_s: float, refused: Callable[[JobRequest], bool]) -> Iterator[JobRequest]:
        """The waiting jobs that may fail: those of a shape `refused` (tried on its first job), and
        those waiting over `timeout_s`; what `plan_drape`'s dispatcher checked every waiting job for."""
        planner = self.planner
        assert planner is not None, "plan() first"
        for queue in planner.queues.values():
            if refused(planner.pending[queue[0][-1]]):
                yield from (planner.pending[key[-1]] for key in queue)
        for _, job_id in self.waiting.irange(maximum=(now - timeout_s, "")):
            yield planner.pending[job_id]

    def waits(self, now: float, started: set[str]) -> tuple[int, float]:
        """(jobs waiting over `STARVED_AFTER_S`, the longest wait) of the waiting jobs not in `started`."""
        waiting, pending = self.waiting, self.planner.pending if self.planner else {}
        over = now - STARVED_AFTER_S
        starved = waiting.bisect_left((over, "")) - len(
            [job for job in started if job in pending and pending[job].submit_s < over]
        )
        oldest = next((now - submit for submit, job_id in waiting if job_id not in started), 0.0)
        return starved, max(oldest, 0.0)

    def counts(
        self, started: set[str], preempted: list[str], failed: int, count_all: Callable[[], dict[str, int]]
    ) -> dict[str, int]:
        """Jobs per state: queued and running from the planner as this cycle read them, moved by what
        the cycle `started`, `preempted` (back to the queue unless started again) and `failed`; the
        ended states from `count_all` every `ENDED_EVERY` cycles (a count over the whole history)."""
        planner = self.planner
        assert planner is not None, "plan() first"
        if self.cycles % ENDED_EVERY == 0:
            self.ended = {state: count for state, count in count_all().items() if state not in ("queued", "running")}
        self.cycles += 1
        came = sum(1 for job_id in started if job_id in planner.pending)
        back = sum(1 for job_id in set(preempted) if job_id not in started)
        queued, running = len(planner.pending) - came - failed + back, len(planner.running) + came - back
        return {**self.ended, "queued": queued, "running": running}
