"""Replays of a week: the week as built, then equally likely copies of it, for judging on medians.

One replay of a week is one draw of a chaotic process. Where a GPU model has a node or two, which
long job takes a freed GPU first decides the makespan (`benchmarks/openb_week.py`); on the gang
weeks, which gang job a bound stops first decides a class's max delay (on the fine-tunes week,
seed 1, under `policy_sweep.py`'s "backlog" setting, moving every submit by under a minute moved
the 5-8 class's max delay from 8.7 h to 4.2 h, across its 4.9 h goal). A copy moves every submit by
up to `JITTER_S` either way (never before 0), drawn by a tag and the replay's number, so runs repeat.
"""

from __future__ import annotations

import random
from dataclasses import replace

from scheduler.sim import TraceJob

JITTER_S = 60.0  # each replay after the first moves every submit by up to this, either way
MAX_REPLAYS = 25


def jittered(trace: list[TraceJob], tag: str, replay: int) -> list[TraceJob]:
    """`trace` with each submit moved by up to `JITTER_S` either way (never before 0), drawn by
    (`tag`, `replay`): an equally likely week."""
    rng = random.Random(f"{tag}/{replay}")
    moved = [replace(j, submit_s=max(0.0, j.submit_s + rng.uniform(-JITTER_S, JITTER_S))) for j in trace]
    return sorted(moved, key=lambda j: (j.submit_s, j.job_id))


def most(met: int, replays: int) -> bool:
    """Whether a goal met in `met` of a week's `replays` counts as met: in more than half."""
    return 2 * met > replays


def draws(trace: list[TraceJob], tag: str, replays: int) -> list[list[TraceJob]]:
    """The week as built, then `replays` - 1 `jittered` copies."""
    if not 1 <= replays <= MAX_REPLAYS:
        raise ValueError(f"replays: expected 1 to {MAX_REPLAYS}, got {replays}")
    return [trace] + [jittered(trace, tag, k) for k in range(1, replays)]
