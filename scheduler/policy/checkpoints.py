"""Gang waits bounded by checkpoint preemption: which running jobs a long-waiting gang job stops.

Preemption to defragment (`scheduler/policy/preemption.py`) moves only jobs that can restart at once
elsewhere, so on a full fleet an 8-GPU job still waits for a node to drain: hours at high load.
drape's stage jobs resume from checkpoints, and every engine can stop a job and requeue it
(Kubernetes and Kueue by eviction, Slurm by requeue, the local launcher by a signal), so a
multi-GPU job that has waited `PolicyConfig.gang_max_wait_s` may stop running jobs to take a
node. A running job may be stopped when:

- it declared itself preemptible (`JobRequest.preemptible`; an exclusive job never is);
- it was preempted (stopped or moved) fewer than `gang_max_preemptions` times (no job is stopped
  over and over);
- its priority is lower than the waiting job's: jobs of one priority never stop each other, so
  two gang jobs cannot take a node back and forth. Stopping a same-priority gang job submitted
  after the waiting one (first-come-first-served among gang jobs) would change nothing on the
  benchmark: at the moment each seed's longest-waiting 8-GPU job had waited 4 h, every gang job
  holding a node had been submitted before it (27 of 27 seeds that had one waiting then; one
  8-GPU shape and priority per week, and a gang shape's queue is first-come-first-served).
  With `PolicyConfig.gang_stops_longer` (r), a multi-GPU job of the same priority is stoppable
  too when its work left is at least r times the waiting job's run: shortest work first among
  equals. One stopped by it can never stop its stopper back (its run is at least r times the
  other's work left), so nodes do not go back and forth. Why: on the wide week's seed 2
  (`benchmarks/wide_gangs.py`) a 64-GPU job of 2.9 h arrived 2 h after a 64-GPU job of 63.9 h;
  the long one took half the fleet, single-GPU services at the preemption cap held a GPU or two
  on most of the other nodes, and the short one waited 61-87 h, until the long one ended, under
  every policy (the class floor, whose relaxation lets jobs pause at no cost, is 4.3 h).

A stopped job waits again from its requeue: its aging, and for a multi-GPU job its
`gang_max_wait_s`, count from then (`JobRequest.queued_s`), so a resumed day-long service does
not rank by days of aging before the short jobs that never started. With
`PolicyConfig.gang_bound_whole_wait` the bound counts a gang job's waits before its requeues too
(`JobRequest.waited_s`): a gang job stopped after it had waited its bound is overdue again at
once. Why: the goals are on a job's delay (finish - submit - run), and on the wide week
(`benchmarks/wide_gangs.py`) the 2-4 class's max delay under the bound was 1.5-3.4 times its max
wait to first start (18.9 h against 5.5 h), as were wider classes' with `gang_stops_longer`: the
time stopped gang jobs spent off their GPUs, waiting the bound again from the requeue. Aging still
counts from the requeue.

With `PolicyConfig.gang_bound_backlog` k the bound rises to k times the queue's backlog while
that is longer: the GPU-seconds of work waiting over the fleet's GPUs, the time the whole fleet
needs to run what waits (`gang_bound`). Why: at a peak every job must wait, and a bound fixed
below the peak's wait lets overdue gang jobs take the whole fleet while the single-GPU queue
grows by hundreds (the wide week's seed 1, hours 23-40: every GPU held by gang jobs, 798
single-GPU jobs waiting). Raised with the backlog, the bound lets gang jobs wait their share
of a peak, and the single-GPU jobs keep starting: on the wide and gang weeks
(`benchmarks/policy_sweep.py`) its setting with the most goals met 44 of 63 with the worst week's
1-GPU mean wait at 28 min (k = 0.5 beside `short_job_bonus`), the fixed bound's 43 at 79 min;
no setting of either met every goal. The backlog counts every waiting job's expected run, so a
queue that declares long runs waits longer before gangs stop others.

With `PolicyConfig.gang_stops_waited` (H) a gang job that has waited H in all may stop a running
multi-GPU job of its own priority that, when it started, had waited at least H less than it has
now (`waited_less`; waits are whole waits, so the option needs `gang_bound_whole_wait`). It may do
so whatever its bound says (`overdue`): such a stop takes a node from one gang job for another and
no room from single-GPU jobs, which only the bound may stop (`past_bound`). Of such nodes it takes
the one whose gang job had waited least, then the one with the most work left, then as below. So
the gang jobs that have waited longest run, as with processor sharing, and a stopped one stops
another once it has waited H longer than that one had: H keeps nodes from going back and forth.
Why: with every node holding a long gang job, first-come-first-served (and `gang_stops_longer`,
which lets the shortest work go first) leaves a gang job that arrives behind them waiting until one
ends. The 8-GPU jobs of the mixed gang week alone on their 6 nodes (`benchmarks/scheduler.py`,
seeds 1-3) wait at most 10.8, 8.6 and 12.5 h first-come-first-served (12.1, 7.8 and 15.1 h under
`benchmarks/wide_gangs.py`'s "backlog" setting), where the floor for any policy that may stop and
move jobs at no cost is 4.4, 3.5 and 6.7 h; with H = 2 h, each stop losing the work since the last
10-min checkpoint, the planner gives 5.3, 4.9 and 8.2 h with 13, 20 and 18 stops a week
(`wide_gangs.py --parts alone`). Two long gang jobs of one priority on one node take turns, each
stopping the other once its wait passes the other's by H, until `gang_max_preemptions` ends it.
A job may stop only one no wider than itself (a 2-GPU job stopping a 64-GPU one would free far more
than it needs and leave the wide one to gather its GPUs again), and the option excludes
`gang_stops_longer` (a job stopped as the longer of two could stop its stopper back as the one that
waited longer).

The cost of stopping a job is its work since its last checkpoint, estimated as the time since
it started modulo its `checkpoint_every_s`, times its GPUs. Of the nodes with enough GPUs that
are idle or hold only such jobs, the gang job takes, first among those whose stopped jobs can all
start again at once elsewhere (single-GPU jobs, on an idle GPU or beside other jobs where memory
allows: `Preemptor.stop`), the one whose stopped jobs have the least work left (GPU-seconds to
their expected ends: a day-long service stopped late in the week ends the week late), then that
stops the fewest jobs, then loses the least work, then by name; on a node it takes its GPUs
cheapest first (a multi-GPU victim's GPUs cost the same each, so they go together). The stopped
jobs return to the queue and resume from their checkpoint; unlike a defragmenting move they may
wait to start again, so how many wait and for how long count before the minutes of work a
10-min checkpoint loses. Measured (`benchmarks/gang_bound.py`, seeds 1-10 of the three gang
weeks at load 0.85, `gang_max_wait_s` = 3 h; `benchmarks/README.md`): against the least work
lost first, the ratio to the bound rose (medians 0.968 / 0.955 / 0.962 from 0.958 / 0.957 /
0.914) and the seeds meeting every goal from 1 of 30 to 2; the goals still compete for the same
nodes at the gang jobs' peaks. Draining the oldest gang job's reservation, and stopping only while
single-GPU jobs keep room, measured no better and are not kept.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from scheduler.policy.state import MAX_GANG_WAIT_S, JobRequest, PolicyConfig, RunningJob, bound_start, waited_by

if TYPE_CHECKING:
    from scheduler.policy.pool import Pool

Choice = tuple[tuple[str, ...], tuple[str, ...]]  # (GPUs for the waiting job, jobs to stop)
HOMED_LOOK = 32  # of the cheapest nodes, how many are checked for whether their jobs restart at once
WORK_UNIT = 1000  # the backlog sums work in 1/WORK_UNIT GPU-seconds, as integers: one total in any order
MAX_RUN_S = 365 * 86400.0  # a declared run longer than a year counts as a year in the backlog
# `gang_stops_waited`'s comparisons allow this much (s): a replay wakes at the time a wait reaches
# another plus the gap (`waited_wake`), a sum whose last digit two replays' clocks need not share
WAITED_SLACK_S = 1e-6


def work_of(job: JobRequest) -> int:
    """`job`'s part of the backlog: its GPUs times its expected run, in 1/`WORK_UNIT` GPU-seconds. The
    run is read from the queue, so it is bounded: not a number counts as 0, past `MAX_RUN_S` as that."""
    run = job.duration_s if job.duration_s == job.duration_s else 0.0
    return round(max(job.gpus, 0) * min(max(run, 0.0), MAX_RUN_S) * WORK_UNIT)


def backlog_s(work: int, gpus: int) -> float:
    """The queue's backlog: `work` (summed `work_of` the waiting jobs) over the fleet's `gpus`, the
    seconds the whole fleet would need to run what waits."""
    return work / WORK_UNIT / gpus if gpus > 0 else 0.0


def backlog_of(jobs: Iterable[JobRequest], gpus: int, config: PolicyConfig) -> float:
    """The backlog (s) of waiting `jobs` on `gpus` GPUs, for callers that keep no running sum (the
    `Planner` keeps one); 0 without `gang_bound_backlog`, which alone reads it."""
    return backlog_s(sum(map(work_of, jobs)), gpus) if config.gang_bound_backlog else 0.0


def gang_bound(config: PolicyConfig, backlog: float) -> float | None:
    """The wait after which a gang job may stop running jobs: `gang_max_wait_s`, raised with
    `gang_bound_backlog` k to k x `backlog` (s) while that is longer, at most `MAX_GANG_WAIT_S`."""
    bound, k = config.gang_max_wait_s, config.gang_bound_backlog
    if bound is None or not k:
        return bound
    return min(max(bound, k * backlog), MAX_GANG_WAIT_S)


def overdue(job: JobRequest, now: float, config: PolicyConfig, backlog: float = 0.0) -> bool:
    """Whether multi-GPU `job` may stop running jobs: it has waited past its bound (`past_bound`), or
    `gang_stops_waited` in all (then it stops only gang jobs of its priority that waited less)."""
    waited = config.gang_stops_waited
    if waited is not None and job.gpus > 1 and now - bound_start(job, config) >= waited - WAITED_SLACK_S:
        return True
    return past_bound(job, now, config, backlog)


def past_bound(job: JobRequest, now: float, config: PolicyConfig, backlog: float = 0.0) -> bool:
    """Whether multi-GPU `job` has waited past its bound (`gang_bound` at the queue's `backlog`, s):
    since its last requeue, or in all with `gang_bound_whole_wait`. Only then may it stop jobs of a
    lower priority, and with `gang_stops_longer` longer jobs of its own."""
    bound = gang_bound(config, backlog)
    return bound is not None and job.gpus > 1 and now - bound_start(job, config) >= bound


def stoppable(victim: RunningJob, by: JobRequest, config: PolicyConfig, now: float | None = None, bounded: bool = True) -> bool:
    """Whether waiting gang job `by` may stop running `victim` at `now` (see the module docstring;
    without `now`, only jobs of lower priority). `bounded`: `by` is past its bound (else it may stop
    only gang jobs that waited less, `waited_less`)."""
    if not (victim.preemptible and victim.preempted < config.gang_max_preemptions):
        return False
    if now is not None and waited_less(victim, by, config, now):
        return True
    return bounded and (victim.priority < by.priority or (now is not None and longer(victim, by, config, now)))


def waited_less(victim: RunningJob, by: JobRequest, config: PolicyConfig, now: float) -> bool:
    """Whether `victim` is a multi-GPU job of `by`'s priority, no wider than `by`, that had waited at
    least `gang_stops_waited` less when it started than `by` has waited by `now` (`by` may stop it)."""
    gap = config.gang_stops_waited
    return (
        gap is not None
        and victim.priority == by.priority
        and 1 < len(victim.gpus) <= by.gpus
        and waited_by(by, now) >= victim.waited_s + gap - WAITED_SLACK_S
    )


def waited_wake(starts: Iterable[float], waits: Sequence[float], config: PolicyConfig, clock: float) -> float:
    """The first time past `clock` that `waited_less` may newly hold: a waiting gang job's whole wait
    (counted from each of `starts`, their `bound_start`s) reaches a running multi-GPU job's wait at its
    start (`waits`, sorted) plus `gang_stops_waited`; inf without the option. Priorities and widths are
    not looked at: a pass there may place nothing (both replays wake alike, `scheduler/sim`)."""
    gap = config.gang_stops_waited
    if gap is None or not waits:
        return float("inf")
    found = float("inf")
    for since in starts:
        index = bisect.bisect_right(waits, clock - since - gap)
        while index < len(waits) and since + gap + waits[index] <= clock:  # rounding: always past `clock`
            index += 1
        if index < len(waits):
            found = min(found, since + gap + waits[index])
    return found


def longer(victim: RunningJob, by: JobRequest, config: PolicyConfig, now: float) -> bool:
    """Whether `victim` is a multi-GPU job of `by`'s priority with at least `gang_stops_longer`
    times `by`'s run left (`by` may stop it: shortest work first among equals)."""
    ratio = config.gang_stops_longer
    return (
        ratio is not None
        and victim.priority == by.priority
        and len(victim.gpus) > 1
        and victim.expected_end_s - now >= ratio * max(by.duration_s, 0.0)
    )


def lost_s(victim: RunningJob, now: float) -> float:
    """The GPU-seconds of work stopping `victim` at `now` throws away (since its last checkpoint)."""
    return (max(now - victim.started_s, 0.0) % max(victim.checkpoint_every_s, 1.0)) * len(victim.gpus)


def _node_choice(
    job: JobRequest, uuids: list[str], occupants: Callable[[str], list[RunningJob]], now: float
) -> tuple[tuple[float, int, float], Choice] | None:
    """The cheapest `job.gpus` of `uuids` (one node's GPUs that qualify) and what they cost: (work
    lost, jobs stopped, their work left, GPU-seconds)."""
    if len(uuids) < job.gpus:
        return None
    keyed = []
    for uuid in uuids:
        here = sorted(occupants(uuid), key=lambda o: o.id)  # one order of summing, whoever lists them
        keyed.append((sum(lost_s(o, now) / len(o.gpus) for o in here), len(here), uuid))
    chosen = [uuid for *_, uuid in sorted(keyed)[: job.gpus]]
    victims = {o.id: o for uuid in chosen for o in occupants(uuid)}
    lost = sum(lost_s(victims[name], now) for name in sorted(victims))
    left = sum(max(victims[name].expected_end_s - now, 0.0) * len(victims[name].gpus) for name in sorted(victims))
    return (lost, len(victims), left), (tuple(chosen), tuple(sorted(victims)))


def choose_stops(
    job: JobRequest,
    pool: Pool,
    occupants: Callable[[str], list[RunningJob]],
    now: float,
    config: PolicyConfig,
    stopped: set[str],
    homed: Callable[[list[RunningJob], Collection[str]], bool] | None = None,
    bounded: bool = True,
) -> Choice | None:
    """(GPUs for `job`, running jobs to stop) on the cheapest node (the module docstring), or None.
    `occupants(uuid)`: the running jobs on a GPU as the pass sees them; `stopped`: jobs this pass
    already stops (a GPU holding one is not taken again); `homed(victims, nodes)`: whether they can
    all start again at once off `nodes` (such nodes come first, of the `HOMED_LOOK` cheapest: a
    bounded look, as each look reads the fleet's free room; with `gang_stops_rehome`, only such).
    `bounded`: `job` is past its bound; else it stops only gang jobs that waited less (`waited_less`),
    the one that waited least first."""
    by_node: dict[str, list[str]] = {}
    for uuid, gpu in pool.gpus.items():
        if gpu.total_gib < job.mem_gib or not pool.fits_any(job, uuid):
            continue
        here = occupants(uuid)
        if gpu.jobs != len(here):  # taken in this pass, or holds a job the ledger does not list
            continue
        if gpu.observed_used_gib is not None and gpu.observed_used_gib > gpu.allocated_gib + config.idle_mem_gib:
            continue
        if all(o.id not in stopped and stoppable(o, job, config, now, bounded) for o in here):
            by_node.setdefault(gpu.node, []).append(uuid)
    options: list[tuple[tuple, Choice]] = []
    for node, uuids in by_node.items():
        found = _node_choice(job, uuids, occupants, now)
        if found is not None:
            lost, count, left = found[0]
            if bounded:
                options.append(((left, count, lost, node), found[1]))
            else:  # gang jobs that waited less: the one that waited least, the most work left first
                least = min(o.waited_s for o in _victims(found[1], occupants))
                options.append(((least, -left, count, lost, node), found[1]))
    options.sort()
    if not options and config.span_nodes:
        spanned = _span_stops(job, pool, by_node, occupants, now)
        if spanned is not None and config.gang_stops_rehome and homed is not None:
            return spanned if homed(_victims(spanned, occupants), {pool.gpus[uuid].node for uuid in spanned[0]}) else None
        return spanned
    if homed is not None:
        for (*_, node), choice in options[:HOMED_LOOK]:
            if homed(_victims(choice, occupants), (node,)):
                return choice
        if config.gang_stops_rehome:
            return None
    return options[0][1] if options else None


def _victims(choice: Choice, occupants: Callable[[str], list[RunningJob]]) -> list[RunningJob]:
    """The running jobs on the GPUs of `choice` (each once)."""
    return list({o.id: o for uuid in choice[0] for o in occupants(uuid)}.values())


def _span_stops(
    job: JobRequest, pool: Pool, by_node: dict[str, list[str]], occupants: Callable[[str], list[RunningJob]], now: float
) -> Choice | None:
    """For a gang no single node holds: k nodes × g GPUs of one model (`scheduler/policy/gangs.py`:
    the largest g, the smallest GPUs first), on the k nodes whose cheapest g GPUs cost least, as a
    single node is chosen (`choose_stops`: the victims' work left, how many, the work lost, by name)."""
    kinds: dict[tuple[float, str], dict[str, list[str]]] = {}
    for node, uuids in by_node.items():
        for uuid in uuids:
            gpu = pool.gpus[uuid]
            kinds.setdefault((gpu.total_gib, gpu.model), {}).setdefault(node, []).append(uuid)
    for kind in sorted(kinds):
        for per_node in range(min(job.gpus, pool.most), 0, -1):
            needed = job.gpus // per_node
            if job.gpus % per_node or sum(1 for uuids in kinds[kind].values() if len(uuids) >= per_node) < needed:
                continue
            probe = replace(job, gpus=per_node)
            options = sorted(
                (found[0], node, found[1])
                for node, uuids in kinds[kind].items()
                if (found := _node_choice(probe, uuids, occupants, now))
            )
            chosen = sorted(options[:needed], key=lambda option: option[1])
            gpus = tuple(uuid for *_, (uuids, _) in chosen for uuid in uuids)
            return gpus, tuple(sorted({victim for *_, (_, victims) in chosen for victim in victims}))
    return None
