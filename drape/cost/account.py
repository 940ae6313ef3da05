"""A run's GPU-hours: what it held, and what each hour went to.

The run holds `gpus` GPUs (its largest stage job's) for its wall time: the union of its segments
(opened to closed; a resumed run has several) and its jobs' allocations (a queue job can outlive
the flow that submitted it). Every GPU-second of that is put in exactly one category:

- a stage job's allocation (claim to release, from the queue's allocation log) splits, by the
  job's own clock, into start-up (claim to the first step: launch, imports, model build, checkpoint
  load), the training loop (less the GPU-seconds its ranks waited for data and the checkpoint
  stall) and shutdown (the last step to the release: result, process exit, the dispatcher noticing);
- an allocation with no training record in it (failed, killed, or still running) is a failed attempt;
- GPUs of the run a smaller job left unused;
- gate sampling (the gate step, outside any job);
- between stages: everything else (queue wait, snapshot, archive, pre-staging the first stage).

So training plus the overheads is the allocated GPU-hours, and the test replays the allocation
log and the run's segments to check it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from drape import STAGES

CATEGORIES = (
    "training",
    "data wait",
    "checkpoint stall",
    "start-up",
    "shutdown",
    "failed attempts",
    "unused GPUs",
    "gate sampling",
    "between stages",
)
OVERHEADS = CATEGORIES[1:]

Interval = tuple[float, float]


@dataclass(frozen=True)
class Attempt:
    """One claim of GPUs by one of the run's jobs (or an in-process job's own window)."""

    job_id: str
    stage: str | None
    gpus: int
    model: str
    start: float
    end: float | None  # None: still held


class Attempts(list):
    """A run's attempts and where their times came from: `source` (``queue``, ``sacct (slurmdbd)``,
    ``sacct -c (jobcomp)``) and `why` that source, which the cost report states (a plain list:
    the queue's allocation log, or in-process training)."""

    def __init__(self, attempts=(), *, source: str, why: str):
        super().__init__(attempts)
        self.source, self.why = source, why


def job_times(attempts: list[Attempt]) -> dict[str, str]:
    """{source, why} of `attempts`' times, for the cost report."""
    if isinstance(attempts, Attempts):
        return {"source": attempts.source, "why": attempts.why}
    if attempts:
        return {"source": "queue", "why": "the queue's allocation log: each job's GPUs from claim to release"}
    return {"source": "in-process", "why": "no queue job: the stages trained in the flow's own process"}


@dataclass
class GpuAccount:
    gpus: int
    segments: list[Interval]
    held: list[Interval]  # the run's wall time: segments and allocations, merged
    seconds: dict[tuple[str, str], float] = field(default_factory=dict)  # (stage, category) → GPU-seconds
    models: dict[str, str] = field(default_factory=dict)  # stage → the GPU model its job ran on
    windows: dict[str, Interval] = field(default_factory=dict)  # stage → the part of the run it is charged

    @property
    def wall_seconds(self) -> float:
        return measure(self.held)

    @property
    def allocated_gpu_seconds(self) -> float:
        return self.gpus * self.wall_seconds

    def by_category(self) -> dict[str, float]:
        totals = dict.fromkeys(CATEGORIES, 0.0)
        for (_, category), value in self.seconds.items():
            totals[category] += value
        return totals

    def stages(self) -> list[str]:
        return [stage for stage in STAGES if any(s == stage for s, _ in self.seconds)]


def union(intervals: list[Interval]) -> list[Interval]:
    merged: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def measure(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in union(intervals))


def subtract(intervals: list[Interval], cut: list[Interval]) -> list[Interval]:
    """The parts of `intervals` outside `cut`."""
    left = union(intervals)
    for c_start, c_end in union(cut):
        left = [piece for a, b in left for piece in ((a, min(b, c_start)), (max(a, c_end), b)) if piece[1] > piece[0]]
    return left


def clip(intervals: list[Interval], start: float, end: float) -> list[Interval]:
    return [(max(a, start), min(b, end)) for a, b in intervals if min(b, end) > max(a, start)]


def segments(events: list[dict], last_seen: float, moments: tuple[float, ...] | list[float] = ()) -> list[Interval]:
    """The run's open → close segments; a segment never closed (killed) ends at the last thing
    recorded in it or the last of `moments` (its jobs' claims and releases) in it; the last
    segment at `last_seen`, the latest of all."""
    opens = sorted(e["at"] for e in events if e.get("event") == "open")
    closes = sorted(e["at"] for e in events if e.get("event") == "close")
    moments = sorted([t for e in events for t in _times(e)] + list(moments))
    found = []
    for index, opened in enumerate(opens):
        following = opens[index + 1] if index + 1 < len(opens) else float("inf")
        closed = next((c for c in closes if opened <= c < following), None)
        if closed is None:
            inside = [t for t in moments if opened <= t < following]
            closed = max(inside, default=opened) if following != float("inf") else max(last_seen, *inside, opened)
        found.append((opened, closed))
    return found


def _times(event: dict) -> list[float]:
    times = [event.get(name) for name in ("at", "start", "end", "loop_started_at")]
    if event.get("loop_started_at"):
        times.append(event["loop_started_at"] + event.get("train_seconds", 0.0))
    return [float(t) for t in times if t]


def build(events: list[dict], attempts: list[Attempt], now: float) -> GpuAccount:
    """The run's account from its recorded `events` (`drape.cost.timeline.read`) and its jobs' `attempts`."""
    trains = [e for e in events if e.get("event") == "train"]
    jobs = [*attempts, *(_in_process(e) for e in trains if e.get("window"))]
    jobs = [a if a.end is not None else Attempt(a.job_id, a.stage, a.gpus, a.model, a.start, now) for a in jobs]
    last_seen = max([t for e in events for t in _times(e)] + [a.end for a in jobs if a.end], default=now)
    runs = segments(events, last_seen, [t for a in jobs for t in (a.start, a.end) if t is not None])
    gpus = max((a.gpus for a in jobs), default=1)
    held = union(runs + [(a.start, a.end) for a in jobs if a.end])
    account = GpuAccount(gpus, runs, held)
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    for job in jobs:
        _split_job(job, trains, gpus, seconds)
        if job.stage:
            account.models.setdefault(job.stage, job.model)
    busy = union([(a.start, a.end) for a in jobs if a.end])
    gates = [(float(e["start"]), float(e["end"]), e["stage"]) for e in events if e.get("step") == "gate"]
    for start, end, stage in gates:
        seconds[(stage, "gate sampling")] += gpus * measure(subtract([(start, end)], busy))
    account.windows = _windows(events, held)
    for stage, (start, end) in account.windows.items():
        between = clip(subtract(held, busy + [(s, e) for s, e, _ in gates]), start, end)
        seconds[(stage, "between stages")] += gpus * measure(between)
    account.seconds = dict(seconds)
    return account


def _in_process(event: dict) -> Attempt:
    start, end = event["window"]
    return Attempt("in-process", event["stage"], int(event.get("world_size", 1)), event.get("device") or "cpu", start, end)


def _split_job(job: Attempt, trains: list[dict], gpus: int, seconds: dict) -> None:
    """A job's allocation by its own clock: start-up, the loop (data wait, stall, training), shutdown."""
    assert job.end is not None
    stage, length, g = job.stage or "run", job.end - job.start, job.gpus
    if gpus > g:
        seconds[(stage, "unused GPUs")] += (gpus - g) * length
    loop = next(
        (t for t in trains if job.start <= t["loop_started_at"] <= job.end and (job.stage is None or t["stage"] == job.stage)),
        None,
    )
    if loop is None:
        seconds[(stage, "failed attempts")] += g * length
        return
    loop_start = min(max(loop["loop_started_at"], job.start), job.end)
    loop_end = min(loop_start + loop["train_seconds"], job.end)
    inside = (loop_end - loop_start) * g
    wait = min(loop.get("data_wait_gpu_seconds", 0.0), inside)
    stall = min(loop.get("checkpoint_stall_seconds", 0.0) * g, inside - wait)
    seconds[(stage, "start-up")] += (loop_start - job.start) * g
    seconds[(stage, "data wait")] += wait
    seconds[(stage, "checkpoint stall")] += stall
    seconds[(stage, "training")] += inside - wait - stall
    seconds[(stage, "shutdown")] += (job.end - loop_end) * g


def _windows(events: list[dict], held: list[Interval]) -> dict[str, Interval]:
    """Which part of the run each stage is charged: up to the end of its archive step; the time
    after the last archive goes to the stage after it (the one in progress), or the last stage."""
    if not held:
        return {}
    ends = {e["stage"]: float(e["end"]) for e in events if e.get("step") == "archive"}
    touched = {e.get("stage") for e in events if e.get("stage")}
    start, windows = held[0][0], {}  # type: tuple[float, dict[str, Interval]]
    for stage in map(str, STAGES):
        if stage in ends:
            windows[stage] = (start, ends[stage])
            start = ends[stage]
    tail = next((str(s) for s in STAGES if s not in ends and s in touched), None) or (list(windows) or [str(STAGES[0])])[-1]
    if held[-1][1] > start:
        windows[tail] = (windows[tail][0], held[-1][1]) if tail in windows else (start, held[-1][1])
    return windows
