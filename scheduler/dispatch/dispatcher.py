"""The dispatcher: one cycle = renew leases, requeue expired ones, reap finished (and hung) jobs, look at the
fleet, plan with the shared policy, claim transactionally, launch. Several may run at once
against one queue database; claims keep them from allocating the same memory twice.

`submit_and_wait` is what the pipeline's train task calls: submit, then (with
`queue.dispatch_in_process`, as the demo does) dispatch in the same process until the job ends,
relaying the job's log lines.
"""

from __future__ import annotations

import gc
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from drape.cost import CostError, gpu_rate
from drape.ops import metrics
from scheduler.dispatch.drift import check_landings
from scheduler.dispatch.fleet import FleetView, fleet_view, policy_config, unshared
from scheduler.dispatch.live import LivePlanner
from scheduler.dispatch.silence import DispatcherWatch
from scheduler.dispatch.watchdog import Watchdog
from scheduler.engines import build_launcher, claimed_view, spans_nodes
from scheduler.policy import STARVED_AFTER_S, JobRequest
from scheduler.policy.baselines import SPANS_ITSELF, get_policy
from scheduler.policy.gangs import never_fits, spanning, unplaceable
from scheduler.queue.outage import DatabaseWatch, patiently, submit_patiently
from scheduler.queue.store import JobSpec, JobStore, QueueError


@dataclass
class CycleReport:
    started: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    conflicts: int = 0
    seconds: float = 0.0
    fleet_source: str = ""
    note: str = ""


def refusal(job: JobRequest, fleet: list, config) -> str | None:
    """Why no node of `fleet` can ever hold `job` (its GPU count, memory per GPU and the models it
    allows), or None: what submit refuses at once and the dispatcher fails a waiting job with
    (`never_fits`, on the engine's rule for gangs across nodes)."""
    return never_fits(job, fleet, span=spans_nodes(config))


def queue_dir(config) -> Path:
    return config.paths.root_path.resolve() / "queue"


class Dispatcher:
    def __init__(
        self,
        config,
        store: JobStore | None = None,
        launcher=None,
        fleet: Callable[[], FleetView] | None = None,
        dispatcher_id: str | None = None,
        incremental: bool = True,
    ):
        self.config = config
        self.store = store or JobStore(config.queue_url)
        self.launcher = launcher or build_launcher(config, queue_dir(config) / "logs")
        self.fleet = fleet or (lambda: fleet_view(config, self.store))
        self._own_fleet = fleet is None  # the cycle passes the running jobs it read to `fleet_view`
        self.id = dispatcher_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.plan = get_policy(config.queue.policy)
        if spans_nodes(config) and config.queue.policy not in SPANS_ITSELF:  # a baseline's jobs wider than a node: whole nodes
            self.plan = spanning(self.plan)
        self.policy = policy_config(config)  # drape's gangs span nodes where the engine does (`span_nodes`)
        # the drape policy as a Planner kept between cycles (`scheduler/dispatch/live.py`), on every engine and
        # fleet; plan_drape, reading every job each cycle, for the other policies, a fleet view given, and when asked
        use_live = incremental and fleet is None and config.queue.policy == "drape"
        self.live = LivePlanner(self.store.engine, self.policy) if use_live else None
        self.mine: dict[str, str] = {}  # job id → launcher handle, of the jobs this dispatcher watches
        self.landed: dict[str, float] = {}  # job id → when to ask where its pods landed next (inf: checked)
        self.watchdog = Watchdog(config, self.store, self.launcher, self.id)
        self._said: str = ""

    def cycle(self, now: float | None = None) -> CycleReport:
        started_at = time.perf_counter()
        now = time.time() if now is None else now
        report = CycleReport()
        lease = self.config.queue.lease_seconds
        self.store.heartbeat(self.id, lease, now)
        report.adopted, report.requeued = self._take_over(now)
        report.finished = self._reap(now)
        report.finished += self.watchdog.check(self.mine, now)  # hung: no progress reported (watchdog.py)
        if check_landings(self.store, self.launcher, self.mine, self.landed, self.config.queue.launcher, self.id, now):
            self.live_stale()  # a job that drifted moved in the books: read everything again
        if report.adopted or report.requeued:
            self.live_stale()  # a takeover: read everything again
        view, pending, planned = self._plan(now)
        report.fleet_source, report.note = view.source, view.note
        by_uuid = {g.uuid: g for g in view.gpus}
        planned = unshared(planned, view.gpus, self.config)  # two jobs on a GPU only where the node shares it
        report.preempted = self._preempt(planned, now)
        granted = self.store.claim_rows(planned, self.id, lease, self.policy.max_jobs_per_gpu, now)
        report.conflicts = len(planned) - len(granted)  # another dispatcher got there first; next cycle sees it
        handles: dict[str, str] = {}
        claimed = claimed_view((placement for placement, _ in granted), by_uuid)  # who shares a GPU, this cycle's jobs too
        for placement, job in granted:
            try:
                handles[job["id"]] = self.launcher.launch(job, claimed[job["id"]])
            except Exception as error:  # noqa: BLE001 - a launch that fails ends the job, with the reason
                self.store.finish(
                    job["id"], exit_code=-1, message=f"launch failed: {type(error).__name__}: {error}", dispatcher=self.id
                )
                continue
            self.mine[job["id"]] = handles[job["id"]]
            report.started.append(job["id"])
            if '"preempted"' not in (job["labels"] or ""):  # a preempted job's wait was counted when it first started
                metrics.child(metrics.QUEUE_WAIT, job["kind"]).observe(max(now - job["submit_s"], 0.0))
            metrics.child(metrics.QUEUE_PLACEMENTS, job["kind"], by_uuid[placement.gpus[0]].model).inc()
        self.store.set_handles(handles)
        started_ids = {p.job_id for p, _ in granted}
        if self.live is None:
            self._fail_unplaceable([job for job in pending if job.id not in started_ids], view, now)
            waits = [now - job.submit_s for job in pending if job.id not in started_ids]
            starved = sum(1 for wait in waits if wait > STARVED_AFTER_S)
            self._export(view, (starved, max(waits, default=0.0)), self.store.counts())
        else:
            failed = self._fail_unplaceable(self._candidates(view, now, started_ids), view, now)
            counts = self.live.counts(started_ids, report.preempted, failed, self.store.counts)
            self._export(view, self.live.waits(now, started_ids), counts)
        report.seconds = time.perf_counter() - started_at  # the whole cycle, its metrics included
        metrics.DISPATCH_CYCLE.observe(report.seconds)
        return report

    def live_stale(self) -> None:
        if self.live is not None:
            self.live.stale = True

    def _plan(self, now: float) -> tuple[FleetView, list[JobRequest], list]:
        """The fleet view, the waiting jobs (read whole: plan_drape's path only) and the placements
        to make now (with nothing queued the policy may still move jobs)."""
        if self.live is not None:
            view = fleet_view(self.config, self.store, allocations=False)
            planned = self.live.plan(view.gpus, now)
            assert self.live.planner is not None
            view = FleetView(list(self.live.planner.gpus.values()), view.source, view.note)  # with the allocations
            pending: list[JobRequest] = []
        else:
            running = self.store.running()
            view = fleet_view(self.config, self.store, running) if self._own_fleet else self.fleet()
            pending = self.store.pending()
            planned = self.plan(pending, view.gpus, running, now, self.policy)
        if view.note and view.note != self._said:
            print(f"queue: {view.note}")
            self._said = view.note
        return view, pending, planned

    def _candidates(self, view: FleetView, now: float, started: set[str]) -> list[JobRequest]:
        """The waiting jobs `_fail_unplaceable` may fail, from the live planner: each once, none that started."""
        assert self.live is not None
        known = bool(view.gpus) and view.source != "ledger"
        found = self.live.candidates(
            now,
            self.config.queue.placement_timeout_seconds,
            lambda job: known and refusal(job, view.gpus, self.config) is not None,
        )
        return list({job.id: job for job in found if job.id not in started}.values())

    def _preempt(self, planned: list, now: float) -> list[str]:
        """Return the jobs the plan preempts to the queue and stop their launches: this dispatcher's
        own, or any its launcher sees (the owner stops the rest when it next reaps)."""
        preempted = []
        for placement in planned:
            for victim in placement.evicts:
                row = self.store.preempt(victim, by=placement.job_id, now=now)
                if row is None:
                    continue  # it ended or moved on meanwhile; the claim re-checks the GPUs
                ours = self.mine.pop(victim, None)
                handle = ours or row["handle"]
                if ours or (handle and self.launcher.sees(handle)):
                    self.launcher.cancel(victim, handle)
                preempted.append(victim)
                metrics.QUEUE_PREEMPTIONS.labels(kind=row["kind"]).inc()
                why = "to move to an idle GPU" if victim == placement.job_id else f"for {placement.job_id}"
                print(f"queue: preempted {victim} ({row['kind']}) {why}; it resumes from its checkpoint")
        return preempted

    def _fail_unplaceable(self, waiting: list, view: FleetView, now: float) -> int:
        """Fail the waiting jobs no node of the fleet can ever hold (when the fleet is known), and
        those waiting longer than `queue.placement_timeout_seconds`, each with what to do; how many."""
        failed = 0
        timeout = self.config.queue.placement_timeout_seconds
        known = bool(view.gpus) and view.source != "ledger"
        reasons: dict[
            tuple[int, float, tuple[str, ...]], str | None
        ] = {}  # per job shape, once a cycle (10,000 jobs, a few shapes)
        for job in waiting:
            shape = (job.gpus, job.mem_gib, job.models)
            if known and shape not in reasons:
                reasons[shape] = refusal(job, view.gpus, self.config)
            reason = reasons.get(shape)
            if reason is None and now - job.submit_s > timeout:
                reason = (
                    f"no placement within queue.placement_timeout_seconds ({timeout:g} s): it needs {job.gpus} GPU(s) "
                    f"with {job.mem_gib:.1f} GiB free each; free capacity, or raise the timeout"
                )
            if reason and self.store.fail_queued(job.id, reason, now):
                print(f"queue: {job.id} failed: {reason}")
                failed += 1
        return failed

    def _take_over(self, now: float) -> tuple[list[str], list[str]]:
        """Jobs of expired leases: adopted when this dispatcher's launcher sees them, else requeued."""
        adopted, requeued = [], []
        for job in self.store.stale(now):
            if not job["handle"] and (find := getattr(self.launcher, "find_job", None)):
                job["handle"] = find(job["id"])  # started, and its dispatcher died before recording the handle
            if job["handle"] and self.launcher.sees(job["handle"]):
                if self.store.adopt(job, self.id, self.config.queue.lease_seconds, now):
                    self.store.set_handles({job["id"]: job["handle"]})
                    self.mine[job["id"]] = job["handle"]
                    adopted.append(job["id"])
                    print(f"queue: adopted {job['id']} ({job['handle']}) from {job['dispatcher']}")
            elif self.store.requeue(job, now):
                requeued.append(job["id"])
        return adopted, requeued

    def _reap(self, now: float) -> list[str]:
        finished = []
        states = self.store.states(sorted(self.mine))
        for job_id, handle in sorted(self.mine.items()):
            state = states.get(job_id)
            if state in ("cancelled", "queued"):  # cancelled, or preempted by another dispatcher: stop it
                self.launcher.cancel(job_id, handle)
                del self.mine[job_id]
                continue
            if state != "running":  # requeued elsewhere after our lease lapsed
                del self.mine[job_id]
                continue
            outcome = self.launcher.poll(job_id, handle)
            if outcome is None:
                continue
            ended = self.store.finish(
                job_id,
                exit_code=outcome.exit_code,
                message=outcome.message,
                peak_gib=outcome.peak_gib,
                dispatcher=self.id,
                now=now,
                max_attempts=self.config.queue.max_attempts,
            )
            del self.mine[job_id]
            if ended == "queued":
                print(f"queue: {job_id} failed ({outcome.message.splitlines()[0]}); queued for another attempt")
            finished.append(job_id)
        return finished

    def _export(self, view: FleetView, waits: tuple[int, float], counts: dict[str, int]) -> None:
        """Queue metrics; `waits`: the still-queued jobs waiting over an hour, and the longest wait so
        far; `counts`: jobs per state."""
        for state, count in counts.items():
            metrics.QUEUE_JOBS.labels(state=state).set(count)
        metrics.QUEUE_STARVED.set(waits[0])
        metrics.QUEUE_OLDEST_WAIT.set(waits[1])
        nodes = {gpu.uuid: gpu.node for gpu in view.gpus}
        metrics.GPU_MEMORY_ALLOCATED.replace({(g.uuid, g.node, g.model): g.allocated_gib for g in view.gpus})
        metrics.GPU_MEMORY_CAPACITY.replace({(g.uuid, g.node, g.model): g.total_gib for g in view.gpus})
        for model in sorted({gpu.model for gpu in view.gpus}):
            try:  # what an idle hour of this model costs; an unpriced model is left out (`drape cost fleet` names it)
                rate = gpu_rate(self.config.cost, model, self.config.cost.fleet_plan)
            except CostError:
                continue
            metrics.GPU_PRICE.labels(model=model, plan=self.config.cost.fleet_plan).set(rate)
        metrics.FLEET_SOURCE.clear()
        metrics.FLEET_SOURCE.labels(source=view.source).set(1)
        metrics.QUEUE_JOB_GPU_MEMORY.replace(
            {
                (job_id, kind, run, stage, gpu_uuid, nodes.get(gpu_uuid, "")): mem_gib
                for job_id, kind, stage, run, assigned, mem_gib in self.store.running_labels()
                for gpu_uuid in assigned
            }
        )

    def run(
        self,
        *,
        stop: Callable[[], bool] | None = None,
        max_cycles: int | None = None,
        on_cycle: Callable[[CycleReport], None] | None = None,
    ) -> None:
        """Cycle every `queue.poll_seconds` until `stop()` is true or `max_cycles` ran. A cycle that
        fails (the database or the cluster unreachable a moment) is logged and the loop goes on: its
        jobs keep running, and the leases it could not renew are adopted back once it can."""
        # what the process holds by now (modules, config, fleet) lives as long as it: a collection
        # during a cycle then walks only what the cycles make (gc.freeze, as long-running servers do)
        gc.collect()
        gc.freeze()
        cycles, failures, database = 0, 0, DatabaseWatch(self.store.url)
        while not (stop and stop()) and (max_cycles is None or cycles < max_cycles):
            try:
                report = self.cycle()
                failures = 0
                database.answered(f"queue: dispatcher {self.id}")
            except Exception as error:  # noqa: BLE001 - one bad cycle must not end the dispatcher
                failures += 1
                error = database.failed(error)  # a restart: the jobs run on, their leases renewed once it answers
                print(f"queue: dispatcher {self.id}: cycle failed ({failures} in a row): {type(error).__name__}: {error}")
                metrics.DISPATCH_ERRORS.inc()
                time.sleep(min(self.config.queue.poll_seconds * 2**failures, 30.0))
                continue
            if on_cycle:
                on_cycle(report)
            cycles += 1
            time.sleep(self.config.queue.poll_seconds)


def submit_and_wait(
    config, spec: JobSpec, *, on_line: Callable[[str], None] | None = None, timeout_s: float | None = None
) -> dict:
    """Submit `spec`, wait for it to end (dispatching in-process if configured); returns the job row.
    Raises QueueError naming the job when it fails, is cancelled or exceeds `timeout_s`."""
    store = patiently(lambda: JobStore(config.queue_url), config.queue_url, config.queue.max_wait_seconds)
    view = patiently(lambda: fleet_view(config, store), config.queue_url, config.queue.max_wait_seconds)
    if view.gpus and view.source != "ledger":
        if reason := unplaceable(spec.gpus, spec.mem_gib, view.gpus, across_nodes=spans_nodes(config)):
            raise QueueError(f"job {spec.kind} ({spec.stage or 'no stage'}) refused: {reason}")
    job_id = submit_patiently(store, spec, config.queue.max_wait_seconds)
    print(f"queue: submitted {job_id} ({spec.kind}, {spec.gpus}×{spec.mem_gib:.1f} GiB)")
    return wait_for(config, store, job_id, on_line=on_line, timeout_s=timeout_s)


def wait_for(
    config, store: JobStore, job_id: str, *, on_line: Callable[[str], None] | None = None, timeout_s: float | None = None
) -> dict:
    """Wait for job `job_id` to end (dispatching in-process if configured), relaying its log lines."""
    dispatcher = Dispatcher(config, store) if config.queue.dispatch_in_process else None
    watch = DispatcherWatch(config, store, job_id) if dispatcher is None else None  # silence.py
    log_path = queue_dir(config) / "logs" / f"{job_id}.log"
    offset, deadline = 0, None if timeout_s is None else time.monotonic() + timeout_s
    url, budget = store.url, config.queue.max_wait_seconds  # the database restarting: waited out (outage.py)
    while True:
        if dispatcher is not None:
            report = patiently(dispatcher.cycle, url, budget)
            if job_id in report.started:
                print(f"queue: {job_id} started on {store.get(job_id)['assigned']}")
        if on_line and log_path.is_file():
            with open(log_path, "rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
            complete = chunk.rfind(b"\n") + 1
            for line in chunk[:complete].decode(errors="replace").splitlines():
                on_line(line)
            offset += complete
        job = patiently(lambda: store.get(job_id), url, budget)
        if watch is not None:
            watch.check(job)
        if job["state"] == "succeeded":
            return job
        if job["state"] in ("failed", "cancelled"):
            raise QueueError(f"job {job_id} {job['state']}: {job['message']}")
        if deadline is not None and time.monotonic() > deadline:
            store.cancel(job_id)
            if dispatcher is not None:
                dispatcher.cycle()
            raise QueueError(f"job {job_id} did not finish within {timeout_s:.0f} s; cancelled")
        time.sleep(config.queue.poll_seconds)
