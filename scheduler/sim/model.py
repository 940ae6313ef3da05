"""The simulator's model of a fleet running jobs, shared by the reference loop (`reference.py`) and
the incremental replay (`replay.py`):
the live policy code against a fleet, event by event, with GPU contention modelled.

Contention model: the try-on models are compute-bound (two concurrent requests overlapped by
under 7% in the field), so n jobs sharing one GPU progress together at (1 + 0.07 × (n − 1))
times one job's speed, split evenly: co-location buys memory density, not free throughput. A
multi-GPU job runs at the pace of its slowest GPU. Utilization counts busy GPU-time (a GPU with
at least one job), never resident jobs; memory utilization counts allocated GiB-time.

A trace's duration measured while sharing (column `measured` = shared) already holds the
slowdown: such a job runs at its own pace whatever it shares with, so it is not counted twice.

The offered-load bound is the utilization no policy can beat on the trace: all its GPU-work
done back to back, in no less than the time the last job needs after it is submitted. Where jobs
declare shares under 1, a policy that packs them onto one GPU does the same work on fewer busy
GPU-hours, and so stays under the bound however soon it finishes: on a week built from Alibaba's
GPU-sharing trace (`benchmarks/openb_week.py`) drape ended at the shortest makespan possible and
its busy GPU-time was 0.90 of the work. `SimResult.of_shortest` (the shortest makespan over the
makespan) counts the work asked instead; the two agree where no job shares a GPU or is stopped.

A job that declares a `share` under 1 of a GPU's compute keeps full pace while the declared
shares on its GPU sum to at most 1; past that, each job on the GPU progresses at
(1 + overlap × (n − 1)) / (sum of shares), the rule above when no job declares a share.

Preemption (`scheduler/policy/preemption.py`): a preempted job returns to the queue with its remaining
work plus what it loses: the work since its last checkpoint (one every `checkpoint_every_s` of
progress, its own or 600 s) and a restart (`RESTART_S`). Its wait to start again is reported
apart from first waits.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from scheduler.policy import STARVED_AFTER_S, GpuState, JobRequest, Placement, RunningJob, allowed, allows
from scheduler.policy.gangs import never_fits
from scheduler.policy.state import requeued_waited, waited_by
from scheduler.sim.traces import TraceError, TraceJob

CONTENTION_OVERLAP = 0.07
RESTART_S = 60.0  # a preempted job pays a restart (launch, load the checkpoint)


CLASSES = ("1", "2-4", "5-8", "9-16", "17-32", "33-64", "65+")  # job classes by width (GPUs)


def job_class(gpus: int) -> str:
    """A job's width class: 1, 2-4, 5-8 (one node), then gangs wider than a node by powers of two."""
    for name, most in zip(CLASSES, (1, 4, 8, 16, 32, 64)):
        if gpus <= most:
            return name
    return CLASSES[-1]


@dataclass
class SimResult:
    policy: str
    jobs: int
    gpus: int
    utilization: float
    memory_utilization: float
    mean_wait_s: float
    p95_wait_s: float
    starved: int
    makespan_s: float
    bound: float
    placements_by_model: dict[str, int]
    class_waits: dict[str, dict[str, float]] = field(default_factory=dict)  # class → jobs, mean, p95, max (s)
    violations: int = 0  # placements on a GPU model the job excludes
    preemptions: int = 0
    lost_gpu_h: float = 0.0  # GPU-hours of work preemption threw away (since the last checkpoint, and restarts)
    max_requeue_wait_s: float = 0.0  # the longest a preempted job waited to start again
    # class → mean and max of (finish − first start) / duration: what sharing (and preemption) slowed it
    class_stretch: dict[str, dict[str, float]] = field(default_factory=dict)
    # class → jobs, mean, p95, max of finish − submit − duration (s): the wait the class floors bound
    # (`benchmarks/floors/class_floor.py`), counting a stopped job's time off its GPUs, its lost work and
    # any slowdown from sharing, where `class_waits` counts the wait to its first start only
    class_delays: dict[str, dict[str, float]] = field(default_factory=dict)
    shortest_s: float = 0.0  # the shortest makespan any policy could have (`shortest_makespan`)
    job_delays: dict[str, float] = field(default_factory=dict)  # job → its finish − submit − duration (s)

    @property
    def of_bound(self) -> float:
        return self.utilization / self.bound if self.bound else 0.0

    @property
    def of_shortest(self) -> float:
        """The shortest makespan (`shortest_makespan`) over this one: how close the policy came to ending
        the trace as soon as possible. Without shares under 1 and stops, `of_bound` is the same ratio;
        where jobs share a GPU, a policy that packs them serves the same work on fewer busy GPU-hours,
        which `of_bound` counts against it (the module docstring)."""
        return self.shortest_s / self.makespan_s if self.makespan_s > 0 else 0.0


def pace(gpu: GpuState) -> float:
    """Each job's pace on `gpu`: full while the declared shares fit in one GPU, else split."""
    return min(1.0, (1 + CONTENTION_OVERLAP * (gpu.jobs - 1)) / max(gpu.shares, 1e-9))


MAX_POOLS = 64  # of the GPU pools jobs are limited to, how many (the most work first) get a bound of their own


def shortest_makespan(trace: list[TraceJob], gpus: list[GpuState]) -> float:
    """The soonest `trace` can end on `gpus` without co-locating past a GPU's compute (s from the first
    submit), the largest of three fluid bounds: no job ends before its submit plus its run; the work
    submitted from any time on needs the fleet's GPUs back to back from then; and so does the work
    of the jobs limited to a pool of GPU kinds (the models and memory a job may use) on that pool's
    GPUs alone (`MAX_POOLS` pools, the most work first). A job declaring a share of a GPU counts at
    that share (`TraceJob.share`). Co-location past compute overlaps work by `CONTENTION_OVERLAP`
    per extra job, so a policy doing it on a full fleet may end sooner. Why the pools: on a week
    built from Alibaba's trace (`benchmarks/openb_week.py`, 1 in 16 nodes, seed 2) the jobs that
    may run only on G3s need 281 h on its 16 G3s alone, where the fleet's bound says 239 h."""
    kinds = Counter((g.model, g.total_gib) for g in gpus)
    start = min(j.submit_s for j in trace)

    def pool(job: TraceJob) -> frozenset[tuple[str, float]]:
        return frozenset(k for k in kinds if k[1] >= job.peak_mem_gib and allows(job.models, k[0]))

    latest_first = sorted(trace, key=lambda j: -j.submit_s)  # each bound reads the jobs in this order
    pools = [pool(j) for j in latest_first]
    work: dict[frozenset[tuple[str, float]], float] = {}
    for job, of in zip(latest_first, pools, strict=True):
        work[of] = work.get(of, 0.0) + _work(job)
    best = max(j.submit_s + j.duration_s for j in trace) - start
    for limited in sorted(work, key=lambda of: (-work[of], sorted(of)))[:MAX_POOLS]:
        size = sum(kinds[k] for k in limited)
        if size:
            jobs = [j for j, of in zip(latest_first, pools, strict=True) if of <= limited]
            best = max(best, _fluid(jobs, size, start))
    return max(best, _fluid(latest_first, len(gpus), start))


def _work(job: TraceJob) -> float:
    """A job's GPU-seconds, a single-GPU job's at its declared share."""
    return job.duration_s * job.gpus * (job.share if job.gpus == 1 else 1.0)


def _fluid(latest_first: list[TraceJob], gpus: int, start: float) -> float:
    """The latest (submit - `start`) + the work submitted from then on over `gpus` GPUs, of jobs
    given latest submit first."""
    done, latest = 0.0, 0.0
    for job in latest_first:
        done += _work(job)
        latest = max(latest, job.submit_s - start + done / gpus)
    return latest


def offered_load_bound(trace: list[TraceJob], num_gpus: int) -> float:
    work = sum(j.duration_s * j.gpus for j in trace)
    start = min(j.submit_s for j in trace)
    return work / (num_gpus * max(max(j.submit_s + j.duration_s for j in trace) - start, work / num_gpus))


def waits_by_class(waits: list[tuple[str, float]]) -> dict[str, dict[str, float]]:
    found: dict[str, dict[str, float]] = {}
    for name in CLASSES:
        values = sorted(w for c, w in waits if c == name)
        if values:
            found[name] = {
                "jobs": len(values),
                "mean_s": statistics.fmean(values),
                "p95_s": values[int(0.95 * (len(values) - 1))],
                "max_s": values[-1],
            }
    return found


def check_fits(trace: list[TraceJob], fleet: list[GpuState], span: bool = False) -> None:
    """A TraceError naming the first job (by submit) that `fleet`, even empty, could never run, and
    why (`never_fits`: its GPUs, memory and models; `span`: the engine starts gangs across nodes), with
    how many more cannot for the same reason, before a replay that would otherwise wait on it forever."""
    sizes = sorted({gpu.total_gib for gpu in fleet})
    seen: dict[tuple, bool] = {}  # whether a job fits depends on its memory only through the GPU sizes that hold it

    def shape(job: TraceJob) -> tuple:
        return job.gpus, job.models, bisect.bisect_left(sizes, job.peak_mem_gib)

    for job in trace:
        if (key := shape(job)) not in seen:
            seen[key] = never_fits(request_of(job), fleet, span) is None
        if seen[key]:
            continue
        reason = never_fits(request_of(job), fleet, span)
        alike = sum(1 for other in trace if shape(other) == key) - 1
        models = f", models {'|'.join(job.models)}" if job.models else ""
        hint = (
            ". It could run as a gang across nodes, where the engine starts one (Slurm: --config with queue.launcher slurm)"
            if not span and never_fits(request_of(job), fleet, True) is None
            else ""
        )
        more = f" (and {alike} more like it)" if alike else ""
        raise TraceError(
            f"job {job.job_id!r} ({job.gpus} GPU(s) × {job.peak_mem_gib:g} GiB{models}){more} can never run on this "
            f"fleet: {reason}{hint}"
        )


def never_placed(policy: str, pending: Iterable[JobRequest]) -> TraceError:
    """The error of a replay whose waiting jobs `policy` will never place (nothing left to run or
    arrive), naming the first submitted of them: each fits the empty fleet (`check_fits`), so what
    holds them is the policy's rule."""
    waiting = sorted(pending, key=lambda request: (request.submit_s, request.id))
    return TraceError(
        f"policy {policy} can never place {len(waiting)} waiting job(s) on this fleet, though each fits it empty; "
        f"the first submitted: {[request.id for request in waiting[:3]]}"
    )


def release_job(record: dict, gpus: dict[str, GpuState]) -> None:
    for uuid in record["gpus"]:
        gpu = gpus[uuid]
        gpu.jobs -= 1
        gpu.shares = gpu.shares - record["share"] if gpu.jobs else 0.0
        gpu.exclusive = gpu.exclusive and not record["alone"]
        gpu.allocated_gib = gpu.allocated_gib - record["mem"] if gpu.jobs else 0.0


def start_job(
    placement: Placement, request: JobRequest, running: dict[str, dict], gpus: dict[str, GpuState], clock: float, shared: bool
) -> None:
    alone = len(placement.gpus) > 1 or request.exclusive
    for uuid in placement.gpus:
        gpus[uuid].jobs += 1
        gpus[uuid].allocated_gib += placement.mem_gib
        gpus[uuid].shares += request.share
        gpus[uuid].exclusive = alone or gpus[uuid].solo
    running[placement.job_id] = {
        "gpus": placement.gpus,
        "mem": placement.mem_gib,
        "remaining": request.duration_s,
        "expected_end": clock + request.duration_s,
        "shared": shared,  # its duration was measured while sharing: it keeps its own pace
        "share": request.share,
        "alone": alone,
        "request": request,
        "started": clock,
    }


def preempt_job(job_id: str, running: dict[str, dict], gpus: dict[str, GpuState], clock: float) -> tuple[JobRequest, float]:
    """Stop `job_id` and return it to the queue with what is left of its work plus what preemption
    costs: the work since its last checkpoint (every `checkpoint_every_s` of progress) and a restart."""
    record = running.pop(job_id)
    release_job(record, gpus)
    again, lost = requeued(record["request"], record["remaining"], record["started"], clock)
    return again, lost * len(record["gpus"])


def requeued(request: JobRequest, left: float, started: float, clock: float) -> tuple[JobRequest, float]:
    """`request` (as it started at `started`, with `left` seconds of work to do) stopped at `clock`
    and queued again, and the seconds of work its stop costs: the work since its last checkpoint
    (every `checkpoint_every_s` of progress) and a restart. Both replays requeue with it."""
    lost = (request.duration_s - left) % request.checkpoint_every_s + RESTART_S
    again = replace(
        request,
        duration_s=left + lost,
        preempted=request.preempted + 1,
        queued_s=clock,
        waited_s=requeued_waited(request, started),
    )
    return again, lost


def sim_result(
    policy: str, trace: list[TraceJob], gpus: dict[str, GpuState], busy: float, allocated: float, finish_last: float, tally
) -> SimResult:
    start = trace[0].submit_s if trace else 0.0
    makespan = max(finish_last - start, 1e-9)
    total_memory = sum(g.total_gib for g in gpus.values())
    waits, ordered = tally.waits, sorted(tally.waits)
    p95 = ordered[int(0.95 * (len(ordered) - 1))] if ordered else 0.0
    return SimResult(
        policy,
        len(trace),
        len(gpus),
        busy / (len(gpus) * makespan),
        allocated / (total_memory * makespan),
        statistics.fmean(waits) if waits else 0.0,
        p95,
        sum(1 for w in waits if w > STARVED_AFTER_S),
        makespan,
        offered_load_bound(trace, len(gpus)) if trace else 0.0,
        tally.placed_on,
        waits_by_class(tally.classed),
        tally.violations,
        tally.preemptions,
        tally.lost_gpu_s / 3600,
        max(tally.requeue_waits, default=0.0),
        {
            name: {"mean": statistics.fmean(values), "max": max(values)}
            for name in CLASSES
            if (values := [v for c, v in tally.stretch if c == name])
        },
        waits_by_class(tally.delays),
        shortest_makespan(trace, list(gpus.values())) if trace else 0.0,
        tally.job_delays,
    )


@dataclass
class Tally:
    """What a replay counts as it goes."""

    waits: list[float] = field(default_factory=list)  # first starts only
    classed: list[tuple[str, float]] = field(default_factory=list)
    requeue_waits: list[float] = field(default_factory=list)  # preemption → start again
    preempted_at: dict[str, float] = field(default_factory=dict)
    violations: int = 0
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    placed_on: dict[str, int] = field(default_factory=dict)
    started_at: dict[str, float] = field(default_factory=dict)  # first starts
    stretch: list[tuple[str, float]] = field(default_factory=list)  # (class, (finish − first start) / duration)
    delays: list[tuple[str, float]] = field(default_factory=list)  # (class, finish − submit − duration)
    job_delays: dict[str, float] = field(default_factory=dict)  # job → finish − submit − duration

    def started(self, job: TraceJob, request: JobRequest, gpus: tuple[str, ...], models: dict, clock: float) -> None:
        """A start at `clock` (`models`: uuid → GPU): its wait, class and model, or a requeue's wait."""
        if job.job_id in self.preempted_at:
            self.requeue_waits.append(clock - self.preempted_at.pop(job.job_id))
            return
        self.waits.append(clock - job.submit_s)
        self.started_at[job.job_id] = clock
        self.classed.append((job_class(job.gpus), clock - job.submit_s))
        self.violations += any(not allowed(request, models[u].model) for u in gpus)
        model = models[gpus[0]].model
        self.placed_on[model] = self.placed_on.get(model, 0) + 1

    def finished(self, job: TraceJob, clock: float) -> None:
        self.stretch.append((job_class(job.gpus), (clock - self.started_at.pop(job.job_id)) / max(job.duration_s, 1e-9)))
        delay = self.job_delays[job.job_id] = clock - job.submit_s - job.duration_s
        self.delays.append((job_class(job.gpus), delay))


def request_of(job: TraceJob) -> JobRequest:
    return JobRequest(
        job.job_id,
        job.priority,
        job.submit_s,
        job.gpus,
        job.peak_mem_gib,
        job.duration_s,
        job.models,
        job.exclusive,
        job.share,
        preemptible=job.preemptible,
        checkpoint_every_s=job.checkpoint_every_s,
    )


def ongoing_jobs(running: dict[str, dict]) -> list[RunningJob]:
    return [
        RunningJob(
            jid,
            tuple(r["gpus"]),
            r["mem"],
            r["expected_end"],
            r["request"].priority,
            not r["alone"],
            r["request"].preempted,
            r["request"].models,
            r["request"].share,
            preemptible=r["request"].preemptible and not r["request"].exclusive,
            checkpoint_every_s=r["request"].checkpoint_every_s,
            started_s=r["started"],
            waited_s=waited_by(r["request"], r["started"]),
        )
        for jid, r in running.items()
    ]
