"""The baselines drape's policy is measured against, and the registry of policies by name.

`fifo-exclusive` (the field's ad hoc baseline): first come first served, head-of-line blocking,
one job per whole GPU, and only the biggest GPUs, whatever a job needs.

`kueue-like` (the common Kubernetes baseline): a requests quota, BestEffortFIFO, whole GPUs,
kube-scheduler's least-allocated node.

`fifo-easy` (the HPC reference, Slurm's default shape): first come first served, whole GPUs, EASY
backfill: the first job that cannot start gets a reservation (when and where it fits as running jobs
end as expected), a later one starts now if it fits and ends before then or keeps off the reserved
GPUs. `priority-easy` (Slurm's default with a priority plugin): the same, the queue in priority
order (highest first, then first come first served), so EASY's reservation goes to the first job of
the highest priority that cannot start. `fifo-backfill` (the untuned reference): first come first
served, whole GPUs, any job that fits starts (greedy backfill, no reservation). All three take the
smallest free GPUs that hold a job, on one node (the node that leaves the fewest free GPUs behind,
then by name), or, where the engine spans nodes (`PolicyConfig.span_nodes`), as k nodes × g GPUs of
one model (`gangs.even_split`).
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.policy.gangs import even_split
from scheduler.policy.plan import plan_drape
from scheduler.policy.reservation import Reservation
from scheduler.policy.state import GpuState, JobRequest, Placement, PolicyConfig, RunningJob, allowed


def plan_fifo_exclusive(
    pending: list[JobRequest], gpus: list[GpuState], running: list[RunningJob], now: float, config: PolicyConfig = PolicyConfig()
) -> list[Placement]:
    """First come first served, one job per whole GPU, biggest GPUs only; stops at the first job that waits."""
    biggest = max((g.total_gib for g in gpus), default=0.0)
    free_by_node: dict[str, list[str]] = {}
    for gpu in sorted(gpus, key=lambda g: g.uuid):
        if gpu.total_gib == biggest and gpu.jobs == 0:
            free_by_node.setdefault(gpu.node, []).append(gpu.uuid)
    placements = []
    for job in sorted(pending, key=lambda j: (j.submit_s, j.id)):
        node = next((n for n, free in free_by_node.items() if len(free) >= job.gpus and job.mem_gib <= biggest), None)
        if node is None:
            break
        chosen, free_by_node[node] = tuple(free_by_node[node][: job.gpus]), free_by_node[node][job.gpus :]
        placements.append(Placement(job.id, chosen, job.mem_gib))
    return placements


def plan_kueue_like(
    pending: list[JobRequest], gpus: list[GpuState], running: list[RunningJob], now: float, config: PolicyConfig = PolicyConfig()
) -> list[Placement]:
    """A Kueue-like baseline: a requests quota (the whole fleet) admitting jobs first come first
    served, skipping the ones that do not fit now (BestEffortFIFO), whole GPUs per job on one node,
    the node chosen as kube-scheduler's default scoring does (the least allocated), node affinity
    to the allowed GPU models honoured. No memory profiles, no backfill reservation."""
    free: dict[str, list[GpuState]] = {}
    for gpu in sorted(gpus, key=lambda g: g.uuid):
        if gpu.jobs == 0 and gpu.allocated_gib < 1e-6:
            free.setdefault(gpu.node, []).append(gpu)
    placements = []
    for job in sorted(pending, key=lambda j: (j.submit_s, j.id)):
        best = None
        for node, idle in free.items():
            fitting = [g for g in idle if g.total_gib >= job.mem_gib and allowed(job, g.model)]
            if len(fitting) >= job.gpus and (best is None or len(idle) > best[0]):
                best = (len(idle), node, fitting[: job.gpus])
        if best is None:
            continue
        _, node, chosen = best
        free[node] = [g for g in free[node] if g not in chosen]
        placements.append(Placement(job.id, tuple(g.uuid for g in chosen), job.mem_gib))
    return placements


def _whole_fit(job: JobRequest, free: dict[str, list[GpuState]], span: bool, most: int) -> tuple[str, ...] | None:
    """Whole free GPUs for `job` (`free`: node → its free GPUs, smallest first), as the docstring says."""
    best = None
    for node, idle in free.items():
        fitting = [g for g in idle if g.total_gib >= job.mem_gib and allowed(job, g.model)]
        if len(fitting) >= job.gpus:
            key = (sum(g.total_gib for g in fitting[: job.gpus]), len(idle) - job.gpus, node)
            best = min(best, (key, fitting[: job.gpus])) if best else (key, fitting[: job.gpus])
    if best is not None:
        return tuple(g.uuid for g in best[1])
    if not span or job.gpus == 1:
        return None
    kinds: dict[tuple[float, str], dict[str, list[str]]] = {}
    for node, idle in free.items():
        for g in idle:
            if g.total_gib >= job.mem_gib and allowed(job, g.model):
                kinds.setdefault((g.total_gib, g.model), {}).setdefault(node, []).append(g.uuid)
    return next((found for kind in sorted(kinds) if (found := even_split(job.gpus, kinds[kind], most))), None)


def _free(gpus: list[GpuState], taken: set[str], ledger: bool = True) -> dict[str, list[GpuState]]:
    """node → its GPUs free now (`ledger`: nothing on them, not `taken`), smallest first; nodes by name."""
    free: dict[str, list[GpuState]] = {}
    for gpu in sorted(gpus, key=lambda g: (g.total_gib, g.uuid)):
        if (not ledger or (gpu.jobs == 0 and gpu.allocated_gib < 1e-6)) and gpu.uuid not in taken:
            free.setdefault(gpu.node, []).append(gpu)
    return dict(sorted(free.items()))


def _shadow(
    job: JobRequest, gpus: list[GpuState], ends: list[tuple[float, tuple[str, ...]]], span: bool, most: int
) -> Reservation | None:
    """EASY's reservation for `job`: the first expected end (`ends`: (time, GPUs) of the running and
    just placed jobs) after which whole free GPUs hold it, and those GPUs; None: never, as things stand."""
    until: dict[str, float] = {}  # GPU → when its jobs are expected to have ended
    for end, uuids in ends:
        for uuid in uuids:
            until[uuid] = max(until.get(uuid, end), end)
    for gpu in gpus:
        if (gpu.jobs or gpu.allocated_gib >= 1e-6) and gpu.uuid not in until:
            until[gpu.uuid] = float("inf")  # holds what no running job accounts for
    for end in sorted({t for t in until.values() if t != float("inf")}):
        free = _free([g for g in gpus if until.get(g.uuid, float("-inf")) <= end], set(), ledger=False)
        if (found := _whole_fit(job, free, span, most)) is not None:
            return Reservation(end, frozenset(found))
    return None


def _fifo_whole(pending, gpus, running, now, config, easy: bool, by_priority: bool = False) -> list[Placement]:
    most = max((sum(1 for g in gpus if g.node == node) for node in {g.node for g in gpus}), default=0)
    taken: set[str] = set()
    ends = [(job.expected_end_s, job.gpus) for job in running]
    placements, reservation = [], None
    order = (lambda j: (-j.priority, j.submit_s, j.id)) if by_priority else (lambda j: (j.submit_s, j.id))
    for job in sorted(pending, key=order):
        free = _free(gpus, taken)
        chosen = _whole_fit(job, free, config.span_nodes, most)
        if reservation is not None and chosen and now + job.duration_s > reservation.time_s:
            off = {node: [g for g in idle if g.uuid not in reservation.gpus] for node, idle in free.items()}
            chosen = _whole_fit(job, off, config.span_nodes, most)  # it would delay the head: off its GPUs only
        if chosen is None:
            if easy and reservation is None:
                reservation = _shadow(job, gpus, ends, config.span_nodes, most) or Reservation(float("inf"), frozenset())
            continue
        taken.update(chosen)
        ends.append((now + job.duration_s, chosen))
        placements.append(Placement(job.id, chosen, job.mem_gib))
    return placements


def plan_fifo_easy(
    pending: list[JobRequest], gpus: list[GpuState], running: list[RunningJob], now: float, config: PolicyConfig = PolicyConfig()
) -> list[Placement]:
    """First come first served on whole GPUs with EASY backfill (the module docstring)."""
    return _fifo_whole(pending, gpus, running, now, config, easy=True)


def plan_priority_easy(
    pending: list[JobRequest], gpus: list[GpuState], running: list[RunningJob], now: float, config: PolicyConfig = PolicyConfig()
) -> list[Placement]:
    """Highest priority first, then first come first served, on whole GPUs with EASY backfill."""
    return _fifo_whole(pending, gpus, running, now, config, easy=True, by_priority=True)


def plan_fifo_backfill(
    pending: list[JobRequest], gpus: list[GpuState], running: list[RunningJob], now: float, config: PolicyConfig = PolicyConfig()
) -> list[Placement]:
    """First come first served on whole GPUs, any job that fits starting (greedy backfill)."""
    return _fifo_whole(pending, gpus, running, now, config, easy=False)


# the policies that place gangs across nodes themselves where the engine spans nodes (the others
# are given whole idle nodes first: `gangs.spanning`)
SPANS_ITSELF = frozenset({"drape", "fifo-easy", "priority-easy", "fifo-backfill"})

POLICIES: dict[str, Callable[..., list[Placement]]] = {
    "drape": plan_drape,
    "fifo-exclusive": plan_fifo_exclusive,
    "kueue-like": plan_kueue_like,
    "fifo-easy": plan_fifo_easy,
    "priority-easy": plan_priority_easy,
    "fifo-backfill": plan_fifo_backfill,
}


def get_policy(name: str) -> Callable[..., list[Placement]]:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; expected one of {sorted(POLICIES)}")
    return POLICIES[name]
