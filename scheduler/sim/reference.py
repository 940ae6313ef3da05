"""The reference loop: the trace replayed event by event, every running job's pace, the next finish
and the policy's inputs recomputed at every event (the model: `model.py`). Slow and plain: it runs
the baselines, and drape's `plan_drape` when asked (`reference=True`), the oracle the incremental
replay (`replay.py`) is compared with.
"""

from __future__ import annotations

from scheduler.policy import GpuState, JobRequest, Placement, PolicyConfig, queued_at
from scheduler.policy.baselines import SPANS_ITSELF, get_policy
from scheduler.policy.checkpoints import backlog_of, gang_bound, waited_wake
from scheduler.policy.gangs import spanning
from scheduler.policy.state import bound_start, waited_by
from scheduler.sim.model import (
    SimResult,
    Tally,
    check_fits,
    never_placed,
    ongoing_jobs,
    pace,
    preempt_job,
    release_job,
    request_of,
    sim_result,
    start_job,
)
from scheduler.sim.traces import TraceJob


def _wake(pending: dict[str, JobRequest], gpus: int, clock: float, config: PolicyConfig, running: dict[str, dict]) -> float:
    """The next time past `clock` a waiting gang job may preempt: to move jobs (`preempt_after_s` from
    its requeue), to stop them (its gang bound from `bound_start`, risen with the backlog as it stands;
    `gang_stops_waited` from there, and when its wait passes a running gang job's by that much:
    `checkpoints.waited_wake`)."""
    bound = gang_bound(config, backlog_of(pending.values(), gpus, config))
    times, starts = [], []
    for job in pending.values():
        if job.gpus > 1:
            since = bound_start(job, config)
            starts.append(since)
            limits = ((config.preempt_after_s, queued_at(job)), (bound, since), (config.gang_stops_waited, since))
            times += [at + limit for limit, at in limits if limit is not None]
    if config.gang_stops_waited is not None:
        waits = sorted(waited_by(r["request"], r["started"]) for r in running.values() if len(r["gpus"]) > 1)
        times.append(waited_wake(starts, waits, config, clock))
    return min((t for t in times if t > clock), default=float("inf"))


def _apply(
    placements: list[Placement],
    pending: dict[str, JobRequest],
    running: dict,
    gpus: dict,
    by_id: dict,
    clock: float,
    tally: Tally,
    record: list | None = None,  # (time, job, GPUs, evicted jobs) of each start
) -> bool:
    """Start the placements (preempting what they evict first); True when any job was preempted."""
    evicted = False
    for placement in placements:
        for victim in placement.evicts:
            pending[victim], lost = preempt_job(victim, running, gpus, clock)
            tally.preemptions, tally.lost_gpu_s, evicted = tally.preemptions + 1, tally.lost_gpu_s + lost, True
            tally.preempted_at[victim] = clock
        request, job = pending.pop(placement.job_id), by_id[placement.job_id]
        start_job(placement, request, running, gpus, clock, job.measured == "shared")
        if record is not None:
            record.append((clock, placement.job_id, placement.gpus, placement.evicts))
        tally.started(job, request, placement.gpus, gpus, clock)
    return evicted


def simulate(
    trace: list[TraceJob],
    fleet: list[GpuState],
    policy: str = "drape",
    config: PolicyConfig = PolicyConfig(),
    reference: bool = False,
    record: list | None = None,
) -> SimResult:
    """Replay `trace` on `fleet` under `policy` (the module docstring has the model): drape as a
    `Planner` in `scheduler/sim/replay.py`, or (`reference`) as `plan_drape` in this loop, which
    recomputes everything at every event. `record` gets (time, job, GPUs, evicted) per start."""
    if policy == "drape" and not reference:
        from scheduler.sim.replay import replay

        return replay(trace, fleet, config, record)
    plan = get_policy(policy)
    if config.span_nodes and policy not in SPANS_ITSELF:  # a baseline on an engine that spans nodes: whole nodes
        plan = spanning(plan)
    check_fits(trace, fleet, config.span_nodes)
    gpus = {g.uuid: GpuState(g.uuid, g.node, g.model, g.total_gib, solo=g.solo) for g in fleet}
    by_id = {j.job_id: j for j in trace}
    pending: dict[str, JobRequest] = {}
    running: dict[str, dict] = {}
    tally = Tally()
    clock, arrival, busy, allocated = trace[0].submit_s if trace else 0.0, 0, 0.0, 0.0
    finish_last = clock
    while arrival < len(trace) or pending or running:
        # 1. advance the clock to the next finish or arrival, progressing running jobs at their shared rates
        rates = {jid: 1.0 if r["shared"] else min(pace(gpus[u]) for u in r["gpus"]) for jid, r in running.items()}
        next_finish = min((clock + r["remaining"] / rates[jid] for jid, r in running.items()), default=float("inf"))
        wake = _wake(pending, len(gpus), clock, config, running) if policy == "drape" else float("inf")
        upcoming = min(next_finish, wake, trace[arrival].submit_s if arrival < len(trace) else float("inf"))
        if upcoming == float("inf"):
            raise never_placed(policy, pending.values())
        elapsed = upcoming - clock
        busy += elapsed * sum(1 for g in gpus.values() if g.jobs)
        allocated += elapsed * sum(g.allocated_gib for g in gpus.values())
        for jid, r in running.items():
            r["remaining"] -= rates[jid] * elapsed
        clock = upcoming
        # 2. finished jobs free their GPUs; arrivals join the queue
        for jid in [jid for jid, r in running.items() if r["remaining"] <= 1e-6]:
            release_job(running.pop(jid), gpus)
            tally.finished(by_id[jid], clock)
            finish_last = clock
        while arrival < len(trace) and trace[arrival].submit_s <= clock:
            pending[trace[arrival].job_id] = request_of(trace[arrival])
            arrival += 1
        # 3. the live policy places what it can; preempted jobs are planned again at once
        for _ in range(4):
            placements = plan(list(pending.values()), list(gpus.values()), ongoing_jobs(running), clock, config)
            if not _apply(placements, pending, running, gpus, by_id, clock, tally, record):
                break
    return sim_result(policy, trace, gpus, busy, allocated, finish_last, tally)
