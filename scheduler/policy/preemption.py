"""Preemption: how a starving multi-GPU job gets a node.

A multi-GPU job that has waited `PolicyConfig.preempt_after_s` and fits nowhere may take a node
whose GPUs are idle or hold only jobs it may preempt: single-GPU, shareable (not run alone),
preemptible (`JobRequest.preemptible`: a job that declared it may not be stopped never is), of
lower priority, preempted fewer than `max_preemptions` times, and able to start again at once
elsewhere: on an idle GPU off that node. So preemption moves work to defragment the fleet; it never leaves a preempted
job waiting. Of the nodes that would do, it takes the one that preempts the fewest jobs (then the
least GPU memory in use, then by name). A GPU whose DCGM reading shows memory the ledger does
not account for is never taken.

The preempted jobs go back to the queue and resume from their last checkpoint (the dispatcher
stops their launch and requeues them; the simulator charges the work since the last checkpoint
and a restart, see `scheduler/sim/reference.py`).

Spreading (`spread`): co-location is what a full fleet falls back on; once idle GPUs are left
after everything waiting was placed, a job crowded onto a GPU past its compute moves to one, so
long co-located jobs do not run at half pace for days. While a multi-GPU job waits, only onto
idle GPUs its reservation does not hold: not spreading at all while one waits, a day-long service
co-located at a busy hour stayed at half pace while 8-GPU jobs queued, and its end set the
week's makespan.

Measured on `benchmarks/scheduler.py`'s gang weeks over ten seeds (medians), when these were
switches (they are the policy now; the ablations left the runtime with issue 63): preempting into
co-location cut 8-GPU waits most but stretched co-located long jobs (the contention model);
preempting to idle GPUs and spreading cut the 8-GPU jobs' mean wait by 42-52% against drape
with neither (220 against 457 min at load 0.85 on 64 H100). Spreading beside a reservation, with
co-location on the GPU that clears soonest, raised the bound to 0.989-0.998 on every gang week
(from 0.979-0.998, the worst seed 0.917 from 0.892) at a cost in 8-GPU waits on the fine-tune
week (mean 253 against 199 min).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TYPE_CHECKING

from scheduler.policy.checkpoints import choose_stops, longer, overdue, past_bound, waited_less
from scheduler.policy.state import GpuState, JobRequest, Placement, PolicyConfig, RunningJob, queued_at

if TYPE_CHECKING:  # the pool module imports nothing of this one; kept apart for readers
    from scheduler.policy.pool import Pool
    from scheduler.policy.victims import Victims


def preemptible(job: RunningJob, by: JobRequest, config: PolicyConfig) -> bool:
    movable = job.shareable and job.preemptible and len(job.gpus) == 1
    return movable and job.priority < by.priority and job.preempted < config.max_preemptions


def starves(job: JobRequest, now: float, config: PolicyConfig) -> bool:
    """Whether multi-GPU `job` has waited `preempt_after_s` (and so may move jobs to take a node)."""
    patience = config.preempt_after_s
    return patience is not None and job.gpus > 1 and now - queued_at(job) >= patience


def preempt(preemptor: Preemptor, job: JobRequest, pool: Pool, now: float) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(GPUs, jobs to preempt) for `job`, which fits nowhere as things stand: first by moving jobs
    that restart at once elsewhere (when it starves), else by stopping jobs that resume from their
    checkpoints (when it is overdue); None when neither finds a node."""
    if starves(job, now, preemptor.config) and (taken := preemptor.choose(job, pool)):
        return taken
    if overdue(job, now, preemptor.config, preemptor.backlog):
        return preemptor.stop(job, pool, now)
    return None


class Preemptor:
    """The running jobs by GPU for one planning pass; `choose` finds a node to preempt for a job."""

    def __init__(
        self,
        running: list[RunningJob],
        config: PolicyConfig,
        on_gpu: dict[str, list[RunningJob]] | None = None,
        victims: Victims | None = None,
        backlog: float = 0.0,
    ):
        """`on_gpu`: the running jobs by GPU, when the caller keeps them (it is read, never changed);
        `victims`: its index of the nodes to preempt on (`scheduler/policy/victims.py`), kept with them;
        `backlog`: the queue's backlog (s) the gang bound rises with (`checkpoints.gang_bound`)."""
        self.config, self.victims, self.backlog = config, victims, backlog
        self.hopeless: set[tuple] = set()
        self.stop_hopeless: set[tuple] = set()  # shapes `stop` found no node for in this pass
        self.stopped: set[str] = set()  # jobs `stop` stops in this pass
        self.taken: set[str] = set()  # GPUs this pass gave a job by preempting: nothing on them may move
        if on_gpu is None:
            on_gpu = {}
            for job in running:
                for uuid in job.gpus:
                    on_gpu.setdefault(uuid, []).append(job)
        self.on_gpu = on_gpu

    def occupants(self, uuid: str) -> list[RunningJob]:
        return [] if uuid in self.taken else self.on_gpu.get(uuid, [])

    def _candidates(
        self, job: JobRequest, gpus: Iterable[GpuState], fits: Callable[[JobRequest, str], bool]
    ) -> dict[str, list[tuple[int, float, str]]]:
        by_node: dict[str, list[tuple[int, float, str]]] = {}
        for gpu in gpus:
            if gpu.total_gib < job.mem_gib or not fits(job, gpu.uuid):
                continue
            occupants = self.occupants(gpu.uuid)
            if gpu.jobs != len(occupants):  # taken in this pass, or holds a job the ledger does not list
                continue
            if gpu.observed_used_gib is not None and gpu.observed_used_gib > gpu.allocated_gib + self.config.idle_mem_gib:
                continue
            if all(preemptible(o, job, self.config) for o in occupants):
                by_node.setdefault(gpu.node, []).append((len(occupants), gpu.allocated_gib, gpu.uuid))
        return by_node

    def _rehome(self, victims: list[RunningJob], pool: Pool, nodes: Collection[str]) -> bool:
        """Whether every victim can start again at once off `nodes`: on an idle GPU, else beside other
        jobs where memory allows (the jobs a gang job stops for its bound, `stop`)."""
        room = {uuid: pool.gpus[uuid].total_gib for _, uuid in pool.idle}
        room.update((uuid, free) for free, uuid in pool.shared)
        for victim in sorted(victims, key=lambda v: -v.mem_gib):
            probe = JobRequest(victim.id, victim.priority, 0.0, 1, victim.mem_gib, 0.0, victim.models)
            fitting = [
                (free, uuid)
                for uuid, free in room.items()
                if free >= victim.mem_gib and pool.gpus[uuid].node not in nodes and pool.fits_any(probe, uuid)
            ]
            if not fitting:
                return False
            free, home = min(fitting)
            room[home] = free - victim.mem_gib
        return True

    def _rehome_idle(self, victims: list[RunningJob], pool: Pool, node: str) -> bool:
        """`_rehome` without co-location, from the idle index: each victim, largest first, on the
        smallest idle GPU off `node` it may run on that no other victim took."""
        used: set[str] = set()
        for victim in sorted(victims, key=lambda v: -v.mem_gib):
            probe = JobRequest(victim.id, victim.priority, 0.0, 1, victim.mem_gib, 0.0, victim.models)
            home = next(
                (
                    uuid
                    for _, uuid in pool.idle.irange((victim.mem_gib, ""))
                    if uuid not in used and pool.gpus[uuid].node != node and pool.fits_any(probe, uuid)
                ),
                None,
            )
            if home is None:
                return False
            used.add(home)
        return True

    def _options(self, job: JobRequest, pool: Pool) -> Iterator[tuple[tuple[int, float, str], list[tuple[int, float, str]]]]:
        """(cost, chosen GPUs) of every node `job` could take by preempting, cheapest first: all
        GPUs looked at, or (with `victims`) the nodes this pass changed and the index's others."""
        if self.victims is None:
            gpus: Iterable[GpuState] = pool.gpus.values()
        else:
            changed = {pool.gpus[uuid].node for uuid in pool.journal or {}} | set(pool.mixed)
            gpus = [pool.gpus[uuid] for node in changed for uuid in self.victims.planner.nodes[node]]
        options = []
        for node, found in self._candidates(job, gpus, pool.fits_any).items():
            if len(found) >= job.gpus:
                chosen = sorted(found)[: job.gpus]
                options.append(((sum(c[0] for c in chosen), sum(c[1] for c in chosen), node), chosen))
        if self.victims is None:
            yield from sorted(options)
            return
        nodes = self.victims.planner.nodes
        for key, chosen in heapq.merge(sorted(options), ((o, []) for o in self.victims.options(job, changed))):
            if not chosen:  # from the index: the node as the pass sees it (unchanged by the pass)
                found = self._candidates(job, (pool.gpus[uuid] for uuid in nodes[key[2]]), pool.fits_any).get(key[2], [])
                chosen = sorted(found)[: job.gpus]
            yield key, chosen

    def choose(self, job: JobRequest, pool: Pool) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """(GPUs for `job`, jobs to preempt) on the cheapest node whose jobs can move, or None.
        A shape that found nothing finds nothing later in the pass (placements only take room)."""
        shape = _shape(job)
        if shape in self.hopeless or not pool.idle:
            return None  # with no idle GPU, no preempted job could restart at once
        for (moved, _, node), chosen in self._options(job, pool):
            if moved > len(pool.idle):
                break  # each needs an idle GPU of its own, and the options after move no fewer
            victims = {o.id: o for _, _, uuid in chosen for o in self.occupants(uuid)}
            if not self._rehome_idle(list(victims.values()), pool, node):
                continue
            taken = tuple(c[2] for c in chosen)
            self.taken.update(taken)
            return taken, tuple(sorted(victims))
        self.hopeless.add(shape)
        return None

    def shape_may(self, job: JobRequest, now: float, starving: bool) -> bool:
        """Whether a later job of `job`'s shape may still preempt in this pass, `job` having found nothing
        (`starving`: whether it could try). Gang jobs of a shape (one priority) queue by their last requeue,
        so none behind waits longer, and each way `job` may preempt that found nothing ends the shape; but
        with `gang_bound_whole_wait` a requeued one's earlier waits count too (`state.bound_start`): behind
        a job not overdue may wait one that is, so only stops found hopeless end the shape."""
        key = _shape(job)
        if self.config.gang_bound_whole_wait and job.gpus > 1 and key not in self.stop_hopeless:
            return True
        if not starving:
            return False
        moves = not starves(job, now, self.config) or key in self.hopeless
        return not (moves and (not overdue(job, now, self.config, self.backlog) or key in self.stop_hopeless))

    def stop(self, job: JobRequest, pool: Pool, now: float) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """(GPUs for overdue gang `job`, running jobs to stop: they resume from their checkpoints and
        may wait) on the cheapest node (`scheduler/policy/checkpoints.py`), or None."""
        shape = _shape(job)
        if shape in self.stop_hopeless:
            return None

        def homed(victims: list[RunningJob], nodes: Collection[str]) -> bool:
            # jobs stopped as the longer of equals (`checkpoints.longer`) or as equals that waited less
            # (`checkpoints.waited_less`) wait by design: the others must rehome
            waiting = [o for o in victims if longer(o, job, self.config, now) or waited_less(o, job, self.config, now)]
            rest = [o for o in victims if o.id not in {w.id for w in waiting}]
            return all(len(o.gpus) == 1 for o in rest) and self._rehome(rest, pool, nodes)

        bounded = past_bound(job, now, self.config, self.backlog)
        found = choose_stops(job, pool, self.occupants, now, self.config, self.stopped, homed, bounded)
        if found is None:
            self.stop_hopeless.add(shape)
            return None
        self.taken.update(found[0])
        self.stopped.update(found[1])
        return found


def _shape(job: JobRequest) -> tuple:
    """What the preemptor's hopeless sets are kept by: a gang shape (GPUs, memory, models, priority)."""
    return (job.gpus, job.mem_gib, job.models, job.priority)


def spread(
    pool: Pool, running: list[RunningJob], now: float, config: PolicyConfig, exclude: frozenset[str] = frozenset()
) -> list[Placement]:
    """Moves of jobs that share a GPU past its compute (declared shares over 1) onto idle GPUs left
    once everything waiting was placed: co-location is what a full fleet falls back on, not a
    state to stay in. One job per crowded GPU a pass, the one expected to run longest, and only
    shareable jobs expected to run `spread_after_s` more (a move costs the work since the last
    checkpoint and a restart). Each move preempts the job and places it again. GPUs in `exclude`
    (a waiting multi-GPU job's reservation) are not moved onto."""
    crowded: dict[str, list[RunningJob]] = {}
    for job in running:
        gpu = pool.gpus.get(job.gpus[0]) if job.shareable and job.preemptible else None
        if gpu is None or gpu.jobs < 2 or gpu.shares <= 1.0 + 1e-9 or job.preempted >= config.max_preemptions:
            continue
        if job.expected_end_s - now >= (config.spread_after_s or 0.0):
            crowded.setdefault(gpu.uuid, []).append(job)
    moves = []
    for uuid in sorted(crowded, key=lambda u: (-pool.gpus[u].jobs, u)):
        if not pool.idle:
            break
        job = max(crowded[uuid], key=lambda j: (j.expected_end_s, j.id))
        left = max(job.expected_end_s - now, 0.0)
        probe = JobRequest(job.id, job.priority, 0.0, 1, job.mem_gib, left, job.models, share=job.share)
        target = pool.best_fit(probe, exclude=exclude, colocate=False)
        if target is None:
            continue
        pool.leave(uuid, probe)
        pool.take(target, probe)
        moves.append(Placement(job.id, target, job.mem_gib, (job.id,)))
    return moves
