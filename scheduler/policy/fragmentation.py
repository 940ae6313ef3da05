"""Fragmentation: what a placement does to the fleet's ability to place multi-GPU jobs.

After Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation", USENIX ATC'23),
in the one dimension that decides whether a gang job fits here, whole idle GPUs on one node:
a node's c idle GPUs are fragmented for a job of width w when c < w (that job can use none of
them), so the node's fragmentation is the expected number of such GPUs over the workload's
widths, F(c) = c × P(width > c). Taking n GPUs from a node with c idle changes it by
F(c − n) − F(c); the policy takes the placement that grows it least, the fullest node first
among equals.

The workload's widths are the jobs waiting and running now, per GPU size (a job counts for the
sizes whose memory holds it: an 8-GPU job of 70 GiB says nothing about L40S nodes), each job
weighing the GPUs it asks for: one 8-GPU job counts as much as eight single-GPU ones, so a
whole node is worth what the GPUs that need one are (counted per job, the FGD paper's choice,
fifty 2-GPU jobs outweigh five 8-GPU stage jobs and a whole node is broken before a pair).
Integers, not shares, so equal costs are equal exactly.

What it changes: with widths 1 and 8 only, one GPU costs the same (minus the 8-GPU jobs' GPUs)
on every node with 1-7 idle, so the order is the fullest node first, as before. With 2-4-GPU
jobs it is not: a single-GPU job goes to a node with 3 idle GPUs before one with 2 (which a
2-GPU job fills exactly), and a 4-GPU job weighs leaving 1 GPU on a node of 5 against breaking
a whole node of 8 (`tests/unit/test_policy.py` checks each case).

Measured (`benchmarks/scheduler.py`, the week with 2-4-GPU fine-tunes at load 0.85 on 64 H100,
ten seeds, medians against the fullest node first): 0.995 of the offered-load bound against
0.994, 8-GPU jobs' mean wait 241 against 253 min and longest 889 against 901 min, 2-4-GPU jobs'
longest 634 against 562 min. No clear gain there, so it is an option (`queue.placement:
fragmentation`), not the default; with widths 1 and 8 only it places exactly as the fullest node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Widths:
    """The GPUs the workload's jobs of each width (GPUs per job) ask for, for one GPU size."""

    above: tuple[int, ...]  # above[c]: GPUs asked for by jobs wider than c, for c in 0 .. the widest node

    @classmethod
    def of(cls, counts: Counter[int], most: int) -> Widths:
        above = [0] * (most + 1)
        for c in range(most - 1, -1, -1):
            above[c] = above[c + 1] + counts.get(c + 1, 0)
        return cls(tuple(above))

    def fragmented(self, idle: int) -> int:
        """F(c), in GPUs²: `idle` GPUs times the GPUs asked for by jobs too wide for them."""
        return idle * self.above[idle] if 0 <= idle < len(self.above) else 0

    def cost(self, idle: int, taken: int) -> int:
        """What taking `taken` of a node's `idle` GPUs adds to its fragmentation (negative: removes)."""
        return self.fragmented(idle - taken) - self.fragmented(idle)

    def order(self) -> tuple[int, ...]:
        """Idle counts 1 .. the widest node, cheapest node for one more GPU first, the fullest among equals."""
        return tuple(sorted(range(1, len(self.above)), key=lambda c: (self.cost(c, 1), c)))


def widths_by_size(jobs: Iterable[tuple[int, float]], sizes: Iterable[float], most: int) -> dict[float, Widths]:
    """`Widths` per GPU size (GiB) from (GPUs, GiB per GPU) of each job; `most`: the widest node's GPUs."""
    return widths_of_shapes(Counter(jobs), sizes, most)


def widths_of_shapes(shapes: Counter[tuple[int, float]], sizes: Iterable[float], most: int) -> dict[float, Widths]:
    """`widths_by_size` from the jobs counted by shape (GPUs, GiB per GPU), as a planner keeps them."""
    result = {}
    for size in set(sizes):
        counts: Counter[int] = Counter()
        for (width, mem), n in shapes.items():
            if mem <= size:
                counts[width] += n * width
        result[size] = Widths.of(counts, most)
    return result
