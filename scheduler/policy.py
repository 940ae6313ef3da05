"""The drape placement policy: which waiting job goes on which GPUs now. Pure functions, shared
by the live dispatcher and the trace simulator, so what the simulator measures is what runs (the
baselines it is measured against, and the registry by name: `scheduler/baselines.py`).

- priority with aging: effective priority = priority + `aging_per_hour` × hours waited, so no
  job waits forever;
- best fit by memory, fullest node first: a single-GPU job goes to the smallest idle GPU model
  whose memory holds its profile, on the node with the fewest idle GPUs (`pack_nodes`), so whole
  nodes stay free for multi-GPU jobs (or, with `fragmentation`, on the node where taking a GPU
  adds least to the idle GPUs the workload's widths cannot use, the fullest among equals:
  `scheduler/fragmentation.py`); only when no idle GPU fits is it co-located, on the GPU with
  the fewest jobs, of those the one whose jobs are expected to end soonest (so a long job is not
  slowed for days beside another long one), where its memory fits (at most `max_jobs_per_gpu`
  jobs per GPU, never beside a multi-GPU or exclusive job);
- declared sharing: a job that declares a `share` under 1 of a GPU's compute goes first beside
  jobs whose declared shares leave room for it (they keep full pace), keeping idle GPUs whole;
  an `exclusive` job runs alone on an idle GPU;
- warm caches: a job naming a `prefer_node` (where its stage's shards are cached) goes there if it fits;
- GPU models: a job that names the models it may run on (`models`, each a part of a model's name)
  is placed on nothing else (`constraints`);
- idle-aware: a GPU is idle only when the ledger has nothing on it and DCGM agrees (no memory in
  use beyond `idle_mem_gib`, utilization under `idle_util_percent`); free memory is the total
  minus the larger of the ledger's allocations and what DCGM sees in use;
- whole GPUs for multi-GPU jobs, all on one node, and nothing beside them while they run;
- preemption: a multi-GPU job waiting `preempt_after_s` takes a node by moving lower-priority
  shareable jobs elsewhere; and idle GPUs take back jobs crowded onto a shared GPU
  (`spread_after_s`; `scheduler/preemption.py`), except the GPUs reserved for a waiting
  multi-GPU job (none at all while one waits, with `spread_beside_reservation` off);
- EASY backfill: the first job that cannot start gets a reservation (the earliest time and GPUs
  at which it fits, from the running jobs' expected ends); a later job may start now only if it
  ends before that time or does not touch the reserved GPUs.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

from scheduler.fragmentation import Widths, widths_by_size
from scheduler.preemption import Preemptor, spread
from scheduler.reservation import Reservation, reserve

STARVED_AFTER_S = 3600.0  # a job waiting longer than this is starved (metrics, simulator, alerts)
COLOCATION_WINDOW = 32  # co-location weighs this many of the tightest memory fits


@dataclass(frozen=True)
class PolicyConfig:
    aging_per_hour: float = 1.0
    max_jobs_per_gpu: int = 4
    idle_mem_gib: float = 1.0
    idle_util_percent: float = 5.0
    backfill: bool = True
    pack_nodes: bool = True  # single-GPU jobs on the fullest node (False: the first idle GPU by name)
    constraints: bool = True  # honour each job's allowed GPU models (False: ignore them, as drape once did)
    preempt_after_s: float | None = 1200.0  # a multi-GPU job waiting this long may preempt (None: never)
    max_preemptions: int = 2  # a job is preempted at most this many times
    spread_after_s: float | None = 3600.0  # move a crowded GPU's job expected to run this much longer to an idle GPU
    preempt_colocate: bool = False  # a preempted job may restart beside other jobs (False: idle GPUs only)
    fragmentation: bool = False  # score nodes by what a placement does to wider jobs (False: fullest node first)
    spread_beside_reservation: bool = True  # spread while a gang job waits, off its reservation (False: not at all)
    colocate_by_end: bool = True  # share the GPU with the fewest jobs, ending soonest (False: the tightest memory fit)


@dataclass(frozen=True)
class JobRequest:
    """What the policy needs to know about a waiting job (memory per GPU, GiB; times in seconds)."""

    id: str
    priority: int
    submit_s: float
    gpus: int
    mem_gib: float
    duration_s: float
    models: tuple[str, ...] = ()  # GPU models it may run on (a part of the name each); empty: any
    exclusive: bool = False  # a single-GPU job that shares its GPU with nobody (multi-GPU jobs always do)
    share: float = 1.0  # the part of a GPU's compute it declares it uses (< 1: co-located by declaration)
    preempted: int = 0  # times it was preempted so far
    prefer_node: str = ""  # among equal choices, first this node (its shard cache is warm for the job)


def allows(models: tuple[str, ...], model: str) -> bool:
    """Whether a job naming `models` may run on a GPU of `model`: none named, or one is a part of it."""
    return not models or any(pattern.lower() in model.lower() for pattern in models)


def allowed(job: JobRequest, model: str) -> bool:
    """Whether `job` may run on a GPU of `model` (see `allows`)."""
    return allows(job.models, model)


@dataclass
class GpuState:
    uuid: str
    node: str
    model: str
    total_gib: float
    allocated_gib: float = 0.0  # the queue's ledger
    jobs: int = 0  # ledger jobs resident
    observed_used_gib: float | None = None  # DCGM framebuffer used, when known
    observed_util: float | None = None  # DCGM utilization %, when known
    exclusive: bool = False  # holds a job that shares its GPUs with nobody (a multi-GPU or exclusive job)
    shares: float = 0.0  # declared compute shares of the jobs on it (1.0 for each that declared none)

    def free_gib(self) -> float:
        return self.total_gib - max(self.allocated_gib, self.observed_used_gib or 0.0)

    def is_idle(self, config: PolicyConfig) -> bool:
        observed_quiet = (self.observed_used_gib is None or self.observed_used_gib <= config.idle_mem_gib) and (
            self.observed_util is None or self.observed_util < config.idle_util_percent
        )
        return self.jobs == 0 and self.allocated_gib < 1e-6 and observed_quiet


@dataclass(frozen=True)
class RunningJob:
    id: str
    gpus: tuple[str, ...]
    mem_gib: float
    expected_end_s: float
    priority: int = 0
    shareable: bool = False  # a single-GPU job that did not ask to run alone: it may be preempted
    preempted: int = 0
    models: tuple[str, ...] = ()
    share: float = 1.0


@dataclass(frozen=True)
class Placement:
    job_id: str
    gpus: tuple[str, ...]
    mem_gib: float
    evicts: tuple[str, ...] = ()  # running jobs to preempt (requeue) before it starts


@dataclass
class _Pool:
    """Mutable view of the fleet for one planning pass, indexed for best-fit lookups."""

    gpus: dict[str, GpuState]
    config: PolicyConfig
    idle: list[tuple[float, str]] = field(default_factory=list)  # (total, uuid) of idle GPUs
    shared: list[tuple[float, str]] = field(default_factory=list)  # (free, uuid) of GPUs that take more jobs
    idle_by_node: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    idle_count: dict[str, int] = field(default_factory=dict)  # node → idle GPUs
    # total → (its node's idle GPUs, uuid) of idle GPUs: the fullest node's GPU of a size, first
    idle_by_count: dict[float, list[tuple[int, str]]] = field(default_factory=dict)
    widths: dict[float, Widths] = field(default_factory=dict)  # per GPU size; none: the fullest node first
    order: dict[float, tuple[int, ...]] = field(default_factory=dict)  # idle counts, the cheapest node first
    now: float = 0.0  # the planning pass's clock (s)
    ends: dict[str, float] = field(default_factory=dict)  # uuid → when its jobs are expected to have ended
    no_room: float = float("inf")  # no shared GPU takes a job of this many GiB or more (a cache)

    def __post_init__(self):
        for gpu in self.gpus.values():
            self._index(gpu)
        self.idle.sort()
        self.shared.sort()
        for entries in self.idle_by_node.values():
            entries.sort()
        for total, uuid in self.idle:
            self.idle_by_count.setdefault(total, []).append((self.idle_count[self.gpus[uuid].node], uuid))
        for entries in self.idle_by_count.values():
            entries.sort()
        self.order = {size: widths.order() for size, widths in self.widths.items()}

    def _rank(self, total: float, count: int) -> tuple[int, int]:
        """Sort key of a node with `count` idle GPUs for one more GPU of size `total`."""
        widths = self.widths.get(total)
        return (widths.cost(count, 1) if widths else 0, count)

    def _recount(self, node: str, change: int) -> None:
        """`node`'s idle count moves by `change`: its idle GPUs' entries in `idle_by_count` follow."""
        before = self.idle_count.get(node, 0)
        for total, uuid in self.idle_by_node.get(node, []):
            entries = self.idle_by_count[total]
            entries.pop(bisect.bisect_left(entries, (before, uuid)))
            bisect.insort(entries, (before + change, uuid))
        self.idle_count[node] = before + change

    def _index(self, gpu: GpuState, sort: bool = False) -> None:
        add = bisect.insort if sort else list.append
        if gpu.is_idle(self.config):
            if sort:  # after __post_init__: keep `idle_by_count` in step (it is built from the rest there)
                self._recount(gpu.node, +1)
                bisect.insort(self.idle_by_count.setdefault(gpu.total_gib, []), (self.idle_count[gpu.node], gpu.uuid))
            else:
                self.idle_count[gpu.node] = self.idle_count.get(gpu.node, 0) + 1
            add(self.idle, (gpu.total_gib, gpu.uuid))
            add(self.idle_by_node.setdefault(gpu.node, []), (gpu.total_gib, gpu.uuid))
        elif 0 < gpu.jobs < self.config.max_jobs_per_gpu and not gpu.exclusive:
            add(self.shared, (gpu.free_gib(), gpu.uuid))

    def _unindex(self, gpu: GpuState) -> None:
        key = (gpu.total_gib, gpu.uuid)
        position = bisect.bisect_left(self.idle, key)
        if position < len(self.idle) and self.idle[position] == key:
            self.idle.pop(position)
            counted = self.idle_by_count[gpu.total_gib]
            counted.pop(bisect.bisect_left(counted, (self.idle_count[gpu.node], gpu.uuid)))
            mine = self.idle_by_node[gpu.node]
            mine.pop(bisect.bisect_left(mine, key))
            self._recount(gpu.node, -1)
        entries, key = self.shared, (gpu.free_gib(), gpu.uuid)
        position = bisect.bisect_left(entries, key)
        if position < len(entries) and entries[position] == key:
            entries.pop(position)

    def fits(self, job: JobRequest, uuid: str, exclude: frozenset[str]) -> bool:
        return uuid not in exclude and (not self.config.constraints or allowed(job, self.gpus[uuid].model))

    def fits_any(self, job: JobRequest, uuid: str) -> bool:
        return self.fits(job, uuid, frozenset())

    def _idle_single(self, job: JobRequest, exclude: frozenset[str]) -> str | None:
        """The smallest idle GPU model that fits, on the fullest node (fewest idle GPUs) of those.
        (Packing by expected end as well was tried: it cut 8-GPU waits 3% and the bound by 0.08.)"""
        start = bisect.bisect_left(self.idle, (job.mem_gib, ""))
        if self.config.pack_nodes and not exclude and not (self.config.constraints and job.models):
            # every idle GPU fits: the smallest size's cheapest node, from the index
            if start == len(self.idle):
                return None
            entries = self.idle_by_count[self.idle[start][0]]
            for count in self.order.get(self.idle[start][0], ()):
                position = bisect.bisect_left(entries, (count, ""))
                if position < len(entries) and entries[position][0] == count:
                    return entries[position][1]
            return entries[0][1]
        chosen, smallest = None, None
        for total, uuid in self.idle[start:]:
            if smallest is not None and total > smallest:
                break
            if not self.fits(job, uuid, exclude):
                continue
            if not self.config.pack_nodes:
                return uuid
            key = (*self._rank(total, self.idle_count[self.gpus[uuid].node]), uuid)
            if chosen is None or key < chosen:
                chosen, smallest = key, total
        return chosen[-1] if chosen else None

    def _declared(self, job: JobRequest, exclude: frozenset[str]) -> str | None:
        """A GPU whose declared shares leave room for `job`'s (< 1), the tightest by memory."""
        for _, uuid in self.shared[bisect.bisect_left(self.shared, (job.mem_gib, "")) :]:
            if self.gpus[uuid].shares + job.share <= 1.0 + 1e-9 and self.fits(job, uuid, exclude):
                return uuid
        return None

    def _colocate(self, job: JobRequest, exclude: frozenset[str]) -> str | None:
        """The GPU `job` shares, of the `COLOCATION_WINDOW` tightest memory fits: the fewest jobs on
        it, then the soonest its jobs are expected to end (a long job is not slowed for days beside
        another long one), then the tightest. A bounded look: one cycle plans thousands of jobs."""
        if job.mem_gib >= self.no_room:
            return None
        window: list[tuple[int, float, str]] = []
        for _, uuid in self.shared[bisect.bisect_left(self.shared, (job.mem_gib, "")) :]:
            if self.fits(job, uuid, exclude):
                window.append((self.gpus[uuid].jobs, self.ends.get(uuid, self.now), uuid))
                if len(window) == (COLOCATION_WINDOW if self.config.colocate_by_end else 1):
                    break
        if not window and not exclude and not (self.config.constraints and job.models):
            self.no_room = job.mem_gib  # nothing this size or larger fits until a job leaves
        return min(window, key=lambda entry: entry[:2])[-1] if window else None

    def best_fit(self, job: JobRequest, exclude: frozenset[str] = frozenset(), colocate: bool = True) -> tuple[str, ...] | None:
        if job.gpus == 1:
            declared = self._declared(job, exclude) if job.share < 1.0 and not job.exclusive else None
            if declared is not None:
                return (declared,)
            warm = self._idle_single(job, self._off(job.prefer_node, exclude)) if job.prefer_node else None
            if (idle := warm or self._idle_single(job, exclude)) is not None:
                return (idle,)
            shared = self._colocate(job, exclude) if colocate and not job.exclusive else None
            return (shared,) if shared is not None else None
        best = None
        for node, entries in self.idle_by_node.items():
            fitting = [
                uuid for total, uuid in entries[bisect.bisect_left(entries, (job.mem_gib, "")) :] if self.fits(job, uuid, exclude)
            ]
            if len(fitting) >= job.gpus:
                chosen = tuple(fitting[: job.gpus])
                widths = self.widths.get(self.gpus[chosen[-1]].total_gib)
                cost = widths.cost(self.idle_count[node], job.gpus) if widths else 0
                total = sum(self.gpus[u].total_gib for u in chosen)  # first: a warm cache (most jobs prefer none)
                waste = (node != job.prefer_node, total, cost, len(fitting) - job.gpus, node)
                if best is None or waste < best[0]:
                    best = (waste, chosen)
        return best[1] if best else None

    def _off(self, node: str, exclude: frozenset[str]) -> frozenset[str]:  # to try the preferred node alone
        return exclude | frozenset(uuid for uuid, gpu in self.gpus.items() if gpu.node != node)

    def take(self, uuids: tuple[str, ...], job: JobRequest) -> None:
        for uuid in uuids:
            gpu = self.gpus[uuid]
            self._unindex(gpu)
            self.ends[uuid] = max(self.ends.get(uuid, self.now), self.now + job.duration_s)
            gpu.allocated_gib += job.mem_gib
            gpu.jobs += 1
            gpu.shares += job.share
            gpu.exclusive = gpu.exclusive or len(uuids) > 1 or job.exclusive
            self._index(gpu, sort=True)

    def leave(self, uuid: str, job: JobRequest) -> None:
        """Take `job` off GPU `uuid` (it moves in this pass)."""
        gpu = self.gpus[uuid]
        self._unindex(gpu)
        gpu.allocated_gib, gpu.jobs = max(gpu.allocated_gib - job.mem_gib, 0.0), gpu.jobs - 1
        self.no_room = float("inf")
        gpu.shares = max(gpu.shares - job.share, 0.0) if gpu.jobs else 0.0
        self._index(gpu, sort=True)

    def empty(self, uuids: tuple[str, ...]) -> None:
        """Free GPUs whose jobs were all preempted in this pass."""
        for uuid in uuids:
            gpu = self.gpus[uuid]
            self._unindex(gpu)
            self.ends.pop(uuid, None)
            self.no_room = float("inf")
            gpu.allocated_gib, gpu.jobs, gpu.shares, gpu.exclusive, gpu.observed_used_gib = 0.0, 0, 0.0, False, None
            self._index(gpu, sort=True)


def effective_priority(job: JobRequest, now: float, config: PolicyConfig) -> float:
    return job.priority + config.aging_per_hour * max(now - job.submit_s, 0.0) / 3600.0


def plan_drape(
    pending: list[JobRequest], gpus: list[GpuState], running: list[RunningJob], now: float, config: PolicyConfig = PolicyConfig()
) -> list[Placement]:
    """Placements to start now under the drape policy (see the module docstring)."""
    state = {g.uuid: GpuState(**vars(g)) for g in gpus}
    widths = {}
    if config.fragmentation:
        per_node = Counter(g.node for g in gpus)
        shapes = [(j.gpus, j.mem_gib) for j in pending] + [(len(r.gpus), r.mem_gib) for r in running]
        widths = widths_by_size(shapes, {g.total_gib for g in gpus}, max(per_node.values(), default=0))
    clear_at: dict[str, float] = {}  # uuid → when its running jobs are expected to have ended
    for ongoing in running:
        for uuid in ongoing.gpus:
            clear_at[uuid] = max(clear_at.get(uuid, now), ongoing.expected_end_s)
    pool = _Pool(state, config, widths=widths, now=now, ends=clear_at)
    order = sorted(pending, key=lambda j: (-effective_priority(j, now, config), j.submit_s, j.id))
    placements: list[Placement] = []
    reservation: Reservation | None = None
    blocked = False
    patience = config.preempt_after_s
    starving = patience is not None and any(j.gpus > 1 and now - j.submit_s >= patience for j in order)
    preemptor = Preemptor(running, config) if starving else None
    for job in order:
        if not pool.idle and not pool.shared:
            if preemptor is None:
                break  # nothing can start until something ends
            if job.gpus == 1:
                continue  # only a starving multi-GPU job can start, by preempting
        choice = pool.best_fit(job)
        if choice is None and preemptor is not None and job.gpus > 1 and now - job.submit_s >= (patience or 0.0):
            if taken := preemptor.choose(job, pool):
                pool.empty(taken[0])
                pool.take(taken[0], job)
                placements.append(Placement(job.id, taken[0], job.mem_gib, taken[1]))
                continue
        if choice is None:
            if not config.backfill:
                break
            if not blocked:
                blocked = True
                durations = {j.id: j.duration_s for j in order}
                ends = running + [RunningJob(p.job_id, p.gpus, p.mem_gib, now + durations[p.job_id]) for p in placements]
                reservation = reserve(job, state, ends, now, config)
            continue
        if reservation is not None and now + job.duration_s > reservation.time_s and set(choice) & reservation.gpus:
            choice = pool.best_fit(job, exclude=reservation.gpus)
            if choice is None:
                continue
        pool.take(choice, job)
        placements.append(Placement(job.id, choice, job.mem_gib))
    return placements + _spread(pool, pending, placements, running, reservation, now, config)


def _spread(
    pool: _Pool,
    pending: list[JobRequest],
    placements: list[Placement],
    running: list[RunningJob],
    reservation: Reservation | None,
    now: float,
    config: PolicyConfig,
) -> list[Placement]:
    """Moves of crowded jobs onto idle GPUs (`scheduler/preemption.py`); while a multi-GPU job
    waits, only off the reserved GPUs, and none when nothing is reserved."""
    if config.spread_after_s is None or not pool.idle:
        return []
    placed = {p.job_id for p in placements}
    if not any(j.gpus > 1 and j.id not in placed for j in pending):
        return spread(pool, running, now, config)
    if config.spread_beside_reservation and reservation is not None:
        return spread(pool, running, now, config, exclude=reservation.gpus)
    return []
