"""The fleet indexed for best-fit lookups: idle GPUs by size and by their node's idle count,
GPUs that take another job by free memory, nodes by kind (GPU model and size) and idle count.

Every lookup is a bisection or a walk from one (O(log n) in the fleet); every change (`take`,
`leave`, `empty`, or `detach`/`attach` around a change the caller makes) moves a GPU's entries
and its node's. `plan_drape` builds one for a planning pass and drops it; the persistent
`scheduler/policy/planner.py` keeps one for the fleet's life: a pass journals what it changes
(`begin`) and puts it back (`rollback`), and only the jobs that really start or end change it.

A node whose GPUs are not all of one kind is looked at GPU by GPU (the node index holds
uniform nodes only): correct on any fleet, fast on the usual one.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from scheduler.policy.fragmentation import Widths
from scheduler.policy.gangs import even_split, nodes_of
from scheduler.policy.state import COLOCATION_WINDOW, GpuState, JobRequest, PolicyConfig, allowed

Kind = tuple[str, float]  # (GPU model, total GiB)
_MISSING = object()


@dataclass
class Pool:
    """Mutable view of the fleet, indexed for best-fit lookups."""

    gpus: dict[str, GpuState]
    config: PolicyConfig
    idle: SortedList = field(default_factory=SortedList)  # (total, uuid) of idle GPUs
    shared: SortedList = field(default_factory=SortedList)  # (free, uuid) of GPUs that take more jobs
    idle_by_node: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    idle_count: dict[str, int] = field(default_factory=dict)  # node → idle GPUs
    # kind → (its node's idle GPUs, uuid) of idle GPUs: the fullest node's GPU of a kind, first
    idle_by_kind: dict[Kind, SortedList] = field(default_factory=dict)
    widths: dict[float, Widths] = field(default_factory=dict)  # per GPU size; none: the fullest node first
    order: dict[float, tuple[int, ...]] = field(default_factory=dict)  # idle counts, the cheapest node first
    now: float = 0.0  # the planning pass's clock (s)
    ends: dict[str, float] = field(default_factory=dict)  # uuid → when its jobs are expected to have ended
    no_room: float = float("inf")  # no shared GPU takes a job of this many GiB or more (a cache)
    crowded: set[str] = field(default_factory=set)  # GPUs with 2+ jobs whose declared shares pass 1
    journal: dict[str, tuple] | None = None  # uuid → its fields and end before this pass changed them
    changes: int = 0  # GPUs changed so far (a lookup made at the same count finds the same)
    avoid: frozenset[Kind] = frozenset()  # kinds constrained jobs need: unconstrained jobs last (`scarcity.py`)

    def __post_init__(self):
        kinds: dict[str, set[Kind]] = {}
        for gpu in self.gpus.values():
            kinds.setdefault(gpu.node, set()).add((gpu.model, gpu.total_gib))
        self.kind = {node: next(iter(found)) for node, found in kinds.items() if len(found) == 1}  # uniform nodes
        self.mixed = frozenset(node for node, found in kinds.items() if len(found) > 1)
        self.sizes = sorted({gpu.total_gib for gpu in self.gpus.values()})
        self.kinds_of: dict[float, list[Kind]] = {}
        for kind in sorted({(g.model, g.total_gib) for g in self.gpus.values()}):
            self.kinds_of.setdefault(kind[1], []).append(kind)
        self.most = max(_counts(self.gpus.values()).values(), default=0)  # the widest node's GPUs
        # kind → idle count → uniform nodes of that kind with that many idle GPUs
        self.nodes_by_count: dict[Kind, dict[int, SortedList]] = {}
        for gpu in self.gpus.values():
            self._index(gpu)
        for node, count in self.idle_count.items():
            self._file_node(node, count, +1)
        for entries in self.idle_by_node.values():
            entries.sort()
        for total, uuid in self.idle:
            gpu = self.gpus[uuid]
            self.idle_by_kind.setdefault((gpu.model, total), SortedList()).add((self.idle_count[gpu.node], uuid))
        self.set_widths(self.widths)

    def set_widths(self, widths: dict[float, Widths]) -> None:
        self.widths = widths
        self.order = {size: w.order() for size, w in widths.items()}

    # -- the indexes, kept in step --------------------------------------------------------------

    def _file_node(self, node: str, count: int, sign: int) -> None:
        kind = self.kind.get(node)
        if kind is None or count <= 0:
            return
        nodes = self.nodes_by_count.setdefault(kind, {}).setdefault(count, SortedList())
        nodes.add(node) if sign > 0 else nodes.remove(node)

    def _rank(self, total: float, count: int) -> tuple[int, int]:
        """Sort key of a node with `count` idle GPUs for one more GPU of size `total`."""
        widths = self.widths.get(total)
        return (widths.cost(count, 1) if widths else 0, count)

    def _recount(self, node: str, change: int) -> None:
        """`node`'s idle count moves by `change`: its idle GPUs' entries in `idle_by_kind` follow."""
        before = self.idle_count.get(node, 0)
        for total, uuid in self.idle_by_node.get(node, []):
            entries = self.idle_by_kind[(self.gpus[uuid].model, total)]
            entries.remove((before, uuid))
            entries.add((before + change, uuid))
        self._file_node(node, before, -1)
        self._file_node(node, before + change, +1)
        self.idle_count[node] = before + change

    def _index(self, gpu: GpuState, sort: bool = False) -> None:
        if gpu.is_idle(self.config):
            if sort:  # after __post_init__: keep `idle_by_kind` in step (it is built from the rest there)
                self._recount(gpu.node, +1)
                kind = (gpu.model, gpu.total_gib)
                self.idle_by_kind.setdefault(kind, SortedList()).add((self.idle_count[gpu.node], gpu.uuid))
                bisect.insort(self.idle_by_node.setdefault(gpu.node, []), (gpu.total_gib, gpu.uuid))
            else:
                self.idle_count[gpu.node] = self.idle_count.get(gpu.node, 0) + 1
                self.idle_by_node.setdefault(gpu.node, []).append((gpu.total_gib, gpu.uuid))
            self.idle.add((gpu.total_gib, gpu.uuid))
        elif 0 < gpu.jobs < self.config.max_jobs_per_gpu and not gpu.exclusive:
            self.shared.add((gpu.free_gib(), gpu.uuid))
        if gpu.jobs >= 2 and gpu.shares > 1.0 + 1e-9:
            self.crowded.add(gpu.uuid)

    def _unindex(self, gpu: GpuState) -> None:
        key = (gpu.total_gib, gpu.uuid)
        if key in self.idle:
            self.idle.remove(key)
            self.idle_by_kind[(gpu.model, gpu.total_gib)].remove((self.idle_count[gpu.node], gpu.uuid))
            mine = self.idle_by_node[gpu.node]
            mine.pop(bisect.bisect_left(mine, key))
            self._recount(gpu.node, -1)
        self.shared.discard((gpu.free_gib(), gpu.uuid))
        self.crowded.discard(gpu.uuid)

    def detach(self, uuid: str) -> GpuState:
        """Take GPU `uuid` out of the indexes before its state changes (then `attach` it)."""
        self._save(uuid)
        self._unindex(self.gpus[uuid])
        self.changes += 1
        return self.gpus[uuid]

    def attach(self, uuid: str) -> None:
        self._index(self.gpus[uuid], sort=True)

    # -- a planning pass's journal ---------------------------------------------------------------

    def begin(self, now: float) -> None:
        """Start a planning pass at `now`: what it changes is journaled, for `rollback`."""
        self.now, self.no_room, self.journal = now, float("inf"), {}

    def _save(self, uuid: str) -> None:
        if self.journal is not None and uuid not in self.journal:
            g = self.gpus[uuid]
            self.journal[uuid] = (
                g.allocated_gib,
                g.jobs,
                g.shares,
                g.exclusive,
                g.observed_used_gib,
                self.ends.get(uuid, _MISSING),
            )

    def rollback(self) -> None:
        """Put back every GPU the pass changed, as `begin` found it."""
        journal, self.journal = self.journal or {}, None
        for uuid, (allocated, jobs, shares, exclusive, observed, end) in journal.items():
            gpu = self.gpus[uuid]
            self._unindex(gpu)
            gpu.allocated_gib, gpu.jobs, gpu.shares, gpu.exclusive, gpu.observed_used_gib = (
                allocated,
                jobs,
                shares,
                exclusive,
                observed,
            )
            self._index(gpu, sort=True)
            if end is _MISSING:
                self.ends.pop(uuid, None)
            else:
                self.ends[uuid] = end

    # -- lookups ---------------------------------------------------------------------------------

    def fits(self, job: JobRequest, uuid: str, exclude: frozenset[str]) -> bool:
        return uuid not in exclude and allowed(job, self.gpus[uuid].model)

    def fits_any(self, job: JobRequest, uuid: str) -> bool:
        return self.fits(job, uuid, frozenset())

    def _kind_ok(self, job: JobRequest, kind: Kind) -> bool:
        return kind[1] >= job.mem_gib and allowed(job, kind[0])

    def _idle_single(self, job: JobRequest, exclude: frozenset[str], node: str | None = None) -> str | None:
        """The smallest idle GPU model that fits, on the fullest node (fewest idle GPUs) of those
        (`node`: on that node only). (Packing by expected end as well was tried: it cut 8-GPU
        waits 3% and the bound by 0.08.)"""
        if node is not None:
            return self._idle_scan(job, exclude, node)
        avoid = self.avoid if not job.models else frozenset()
        for shunned in (False, True) if avoid else (False,):  # a kind constrained jobs need: only if no other holds it
            for size in self.sizes[bisect.bisect_left(self.sizes, job.mem_gib) :]:
                best = None
                for kind in self.kinds_of[size]:
                    if (kind in avoid) != shunned or not self._kind_ok(job, kind):
                        continue
                    if (found := self._cheapest(kind, exclude)) is not None:
                        best = found if best is None or found < best else best
                if best is not None:
                    return best[-1]
        return None

    def _cheapest(self, kind: Kind, exclude: frozenset[str]) -> tuple[int, int, str] | None:
        """(rank, uuid) of the idle GPU of `kind` on the cheapest node (see `_rank`), not in `exclude`."""
        entries = self.idle_by_kind.get(kind)
        if not entries:
            return None
        for count in self.order.get(kind[1]) or range(1, self.most + 1):
            for held, uuid in entries.irange((count, ""), (count + 1, "")):
                if held == count and uuid not in exclude:
                    return (*self._rank(kind[1], count), uuid)
        return None

    def _idle_scan(self, job: JobRequest, exclude: frozenset[str], node: str | None) -> str | None:
        chosen, smallest = None, None
        entries = (
            self.idle_by_node.get(node, []) if node is not None else self.idle.islice(self.idle.bisect_left((job.mem_gib, "")))
        )
        for total, uuid in entries:
            if total < job.mem_gib:
                continue
            if smallest is not None and total > smallest:
                break
            if not self.fits(job, uuid, exclude):
                continue
            key = (*self._rank(total, self.idle_count[self.gpus[uuid].node]), uuid)
            if chosen is None or key < chosen:
                chosen, smallest = key, total
        return chosen[-1] if chosen else None

    def _declared(self, job: JobRequest, exclude: frozenset[str]) -> str | None:
        """A GPU whose declared shares leave room for `job`'s (< 1), the tightest by memory."""
        for _, uuid in self.shared.islice(self.shared.bisect_left((job.mem_gib, ""))):
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
        for _, uuid in self.shared.islice(self.shared.bisect_left((job.mem_gib, ""))):
            if self.fits(job, uuid, exclude):
                window.append((self.gpus[uuid].jobs, max(self.ends.get(uuid, self.now), self.now), uuid))
                if len(window) == COLOCATION_WINDOW:
                    break
        if not window and not exclude and not job.models:
            self.no_room = job.mem_gib  # nothing this size or larger fits until a job leaves
        return min(window, key=lambda entry: entry[:2])[-1] if window else None

    def best_fit(self, job: JobRequest, exclude: frozenset[str] = frozenset(), colocate: bool = True) -> tuple[str, ...] | None:
        """Where `job` goes now, or None. `colocate` False (a move: `preemption.spread`, `scarcity`):
        an idle GPU only, even for a job that declared a share under 1."""
        if job.gpus == 1:
            declared = self._declared(job, exclude) if colocate and job.share < 1.0 and not job.exclusive else None
            if declared is not None:
                return (declared,)
            warm = self._idle_single(job, exclude, job.prefer_node) if job.prefer_node else None
            if (idle := warm or self._idle_single(job, exclude)) is not None:
                return (idle,)
            shared = self._colocate(job, exclude) if colocate and not job.exclusive else None
            return (shared,) if shared is not None else None
        return self._gang(job, exclude)

    def _gang(self, job: JobRequest, exclude: frozenset[str]) -> tuple[str, ...] | None:
        """Whole idle GPUs on one node, the least waste: a warm cache, the least memory, the least
        fragmentation, the fewest idle GPUs left, then by name. Uniform nodes come from the node
        index (the first node of each kind and idle count); the preferred node, nodes holding an
        excluded GPU and mixed nodes are looked at GPU by GPU."""
        special = {self.gpus[u].node for u in exclude} | self.mixed | ({job.prefer_node} if job.prefer_node else set())
        best = None
        for node in special:
            if (found := self._node_fit(job, node, exclude)) is not None and (best is None or found[0] < best[0]):
                best = found
        for kind, counts in self.nodes_by_count.items():
            if not self._kind_ok(job, kind):
                continue
            for count in range(job.gpus, self.most + 1):
                node = next((n for n in counts.get(count, ()) if n not in special), None)
                if node is not None and (found := self._node_fit(job, node, exclude)) is not None:
                    if best is None or found[0] < best[0]:
                        best = found
        if best is None and self.config.span_nodes:
            return self._span(job, exclude)
        return best[1] if best else None

    def _span(self, job: JobRequest, exclude: frozenset[str]) -> tuple[str, ...] | None:
        """Idle GPUs of one model on several nodes, k nodes × g each (`scheduler/policy/gangs.py`):
        of the smallest GPU size that holds the job, the kind that needs the fewest nodes, then by
        name. It reads every idle GPU of the kinds it looks at (a spanning job's lookup, once a pass
        per shape)."""
        avoid = self.avoid if not job.models else frozenset()
        groups = [(shunned, size) for shunned in (False, True) for size in self.sizes if size >= job.mem_gib]
        for shunned, size in groups:
            best = None
            for kind in self.kinds_of[size]:
                if (kind in avoid) != shunned or not self._kind_ok(job, kind):
                    continue
                free: dict[str, list[str]] = {}
                for _, uuid in self.idle_by_kind.get(kind, ()):
                    if uuid not in exclude:
                        free.setdefault(self.gpus[uuid].node, []).append(uuid)
                if sum(len(uuids) for uuids in free.values()) < job.gpus:
                    continue
                for uuids in free.values():
                    uuids.sort()
                found = even_split(job.gpus, free, self.most)
                if found is not None and (best is None or nodes_of(found, self.gpus) < best[0]):
                    best = (nodes_of(found, self.gpus), found)
            if best is not None:
                return best[1]
        return None

    def _node_fit(self, job: JobRequest, node: str, exclude: frozenset[str]) -> tuple[tuple, tuple[str, ...]] | None:
        entries = self.idle_by_node.get(node, [])
        fitting = [
            uuid for total, uuid in entries[bisect.bisect_left(entries, (job.mem_gib, "")) :] if self.fits(job, uuid, exclude)
        ]
        if len(fitting) < job.gpus:
            return None
        chosen = tuple(fitting[: job.gpus])
        last = self.gpus[chosen[-1]]
        widths = self.widths.get(last.total_gib)
        cost = widths.cost(self.idle_count[node], job.gpus) if widths else 0
        total = sum(self.gpus[u].total_gib for u in chosen)  # first: a warm cache (most jobs prefer none)
        shunned = not job.models and (last.model, last.total_gib) in self.avoid
        return (node != job.prefer_node, shunned, total, cost, len(fitting) - job.gpus, node), chosen

    # -- changes in a pass -----------------------------------------------------------------------

    def take(self, uuids: tuple[str, ...], job: JobRequest) -> None:
        for uuid in uuids:
            gpu = self.detach(uuid)
            self.ends[uuid] = max(self.ends.get(uuid, self.now), self.now + job.duration_s)
            gpu.allocated_gib += job.mem_gib
            gpu.jobs += 1
            gpu.shares += job.share
            gpu.exclusive = gpu.exclusive or len(uuids) > 1 or job.exclusive or gpu.solo
            self.attach(uuid)

    def leave(self, uuid: str, job: JobRequest) -> None:
        """Take `job` off GPU `uuid` (it moves in this pass)."""
        gpu = self.detach(uuid)
        gpu.allocated_gib, gpu.jobs = max(gpu.allocated_gib - job.mem_gib, 0.0), gpu.jobs - 1
        self.no_room = float("inf")
        gpu.shares = max(gpu.shares - job.share, 0.0) if gpu.jobs else 0.0
        self.attach(uuid)

    def empty(self, uuids: tuple[str, ...]) -> None:
        """Free GPUs whose jobs were all preempted in this pass."""
        for uuid in uuids:
            gpu = self.detach(uuid)
            self.ends.pop(uuid, None)
            self.no_room = float("inf")
            gpu.allocated_gib, gpu.jobs, gpu.shares, gpu.exclusive, gpu.observed_used_gib = 0.0, 0, 0.0, False, None
            self.attach(uuid)


def _counts(gpus) -> dict[str, int]:
    found: dict[str, int] = {}
    for gpu in gpus:
        found[gpu.node] = found.get(gpu.node, 0) + 1
    return found
