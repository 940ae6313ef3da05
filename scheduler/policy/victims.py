"""Where a starving multi-GPU job may preempt, without looking at every GPU.

`Preemptor.choose` (`scheduler/policy/preemption.py`) takes, of the nodes with enough GPUs that are
idle or hold only jobs the waiting job may preempt, the one that preempts the fewest jobs (then
the least memory, then by name), if its jobs can restart at once elsewhere. Whether a GPU's
jobs may be preempted depends on the waiting job only through its priority (each must be a
single-GPU shareable job of lower priority, preempted fewer than `max_preemptions` times), so
a `Victims` keeps, per (GPU kind, width, priority), the uniform nodes sorted by that cost,
updated as jobs start and end on a node, and `options` reads them cheapest first. The planner
built per kind, width and priority only when a waiting job first asks: a handful in practice.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

from scheduler.policy.state import JobRequest

if TYPE_CHECKING:
    from scheduler.policy.planner import Planner

Option = tuple[int, float, str]  # (jobs preempted, GiB they hold, node)


class Victims:
    """Per (GPU kind, width, priority): uniform nodes by the cheapest preemption they offer."""

    def __init__(self, planner: Planner):
        self.planner = planner
        self.index: dict[tuple, SortedList] = {}  # (kind, width, priority) → options
        self.held: dict[str, dict[tuple, Option]] = {}  # node → (width, priority) → its option in the index

    def _option(self, node: str, width: int, priority: int) -> Option | None:
        """The cheapest `width` GPUs of `node` a job of `priority` may preempt (kept state)."""
        planner, config = self.planner, self.planner.config
        found = []
        for uuid in planner.nodes[node]:
            gpu, occupants = planner.gpus[uuid], planner.on_gpu.get(uuid, [])
            if gpu.jobs != len(occupants):
                continue
            if gpu.observed_used_gib is not None and gpu.observed_used_gib > gpu.allocated_gib + config.idle_mem_gib:
                continue
            if all(
                o.shareable
                and o.preemptible
                and len(o.gpus) == 1
                and o.priority < priority
                and o.preempted < config.max_preemptions
                for o in occupants
            ):
                found.append((len(occupants), gpu.allocated_gib, uuid))
        if len(found) < width:
            return None
        chosen = sorted(found)[:width]
        return (sum(c[0] for c in chosen), sum(c[1] for c in chosen), node)

    def refresh(self, node: str) -> None:
        """`node`'s jobs changed: its place in every index of its kind follows."""
        kind = self.planner.pool.kind.get(node)
        if kind is None:
            return
        held = self.held.setdefault(node, {})
        for (indexed, width, priority), options in self.index.items():
            if indexed != kind:
                continue
            option = self._option(node, width, priority)
            before = held.get((width, priority))
            if before != option:
                if before is not None:
                    options.remove(before)
                if option is not None:
                    options.add(option)
                    held[(width, priority)] = option
                else:
                    held.pop((width, priority), None)

    def _options(self, kind: tuple, width: int, priority: int) -> SortedList:
        if (kind, width, priority) not in self.index:
            options = self.index[(kind, width, priority)] = SortedList()
            for node, of in self.planner.pool.kind.items():
                if of == kind and (option := self._option(node, width, priority)) is not None:
                    options.add(option)
                    self.held.setdefault(node, {})[(width, priority)] = option
        return self.index[(kind, width, priority)]

    def options(self, job: JobRequest, skip: set[str]) -> Iterator[Option]:
        """The uniform nodes of the kinds `job` fits, cheapest first, but those in `skip`."""
        pool = self.planner.pool
        kinds = [kind for kind in sorted(set(pool.kind.values())) if pool._kind_ok(job, kind)]
        merged = heapq.merge(*(self._options(kind, job.gpus, job.priority) for kind in kinds))
        return (option for option in merged if option[2] not in skip)
