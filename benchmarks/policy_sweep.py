"""The gang bound's settings against issue 66's goals, every combination on every week (`--parts`).

`benchmarks/wide_gangs.py` judges a few chosen policies; this replays a grid of them to show
whether any setting of the knobs meets the goals together, and which trade-offs are on offer.
Each combination keeps the bound on a gang job's whole wait (`gang_bound_whole_wait`) and sets:
the bound `gang_max_wait_s` (`--bound-hours`), the short single-GPU jobs' rank `short_job_bonus`
(`--bonus`) and which single-GPU jobs it lifts (`short_job_s`, `--short-hours`), the bound risen
with the queue's backlog `gang_bound_backlog` (`--backlog`),
`gang_stops_longer` (`--longer`, "off": jobs of one priority never stop each other),
`gang_max_preemptions` (`--caps`: how often one job may be stopped for an overdue gang) and
`gang_stops_waited` (`--waited`, hours, "off": waits balanced among gang jobs; a combination with
`gang_stops_longer` too is left out, as the policy refuses it).

Weeks: the wide-gang week (`wide_gangs.wide_week`, 128 H100 across nodes) per seed and the three
single-node gang weeks (`wide_gangs.gang_weeks`), with `wide_gangs`'s floors (computed once per
week) and goals: each multi-GPU class's max delay <= max(1.25 x its floor beside a 5-min 1-GPU
mean, 1 h); the widest classes' max delay below `fifo-easy`'s on that week; the 1-GPU mean wait
<= 5 min; work lost <= 1% of the week's GPU-hours. Printed per combination and week: the goals
met of those asked, the 1-GPU mean wait and beside it the 1-GPU mean delay (finish - submit -
run: it counts a stopped job's time off its GPUs, which the wait to first start leaves out), the
work lost. Then the frontier (the combinations no other beats on both the goals met and the
worst 1-GPU mean wait) and whether any combination met every goal on every week.

`--replays K` judges each week on K replays (`benchmarks/replays.py`: the week as built, then
K - 1 copies with every submit moved by up to a minute), each against its own floors and its own
`fifo-easy`: a goal counts as met on a week where more than half its replays meet it
(`replays.most`, as in `wide_gangs.py`: with an even K a tie is a miss), the 1-GPU mean wait and
delay and the work lost are the medians, and each cell gives the range of goals met over the
replays.

    .venv/bin/python benchmarks/policy_sweep.py [--seeds 1-3] [--parts wide,gang]
        [--bound-hours 1,3,6] [--backlog 0,0.5] [--bonus 0,20] [--short-hours 1] [--longer off,2]
        [--caps 4,16] [--waited off] [--replays 1] [--workers 2]   # the default grid: 48 combinations, ~10 min on 2 cores
    .venv/bin/python benchmarks/policy_sweep.py --search 200 [--search-seed 1] [--parts gang] ...

`--search N` replays N combinations drawn at random (seeded) from every setting instead of the
grid (`benchmarks/sweep_search.py`): besides the grid's settings, whether stops keep to jobs that
restart at once (`gang_stops_rehome`), how many jobs may share a GPU, when and how often a waiting
multi-GPU job moves single-GPU jobs (`preempt_after_s`, `max_preemptions`), spreading and aging,
which the grid holds at their defaults. The report adds, per week, the most goals one combination met there and
what each such combination missed: two goals that no combination meets together show as the
best combinations splitting between them.

`--confirm M` replays the M best combinations again (the most goals met, then the lowest worst
1-GPU mean wait, then the order drawn) on `--confirm-replays K` replays of each week (3 by
default) and reports them as above: a screen on one replay picks by one draw of each week, and a
goal counts only where most of K replays meet it. The screen's replays are drawn as the first of
those K, so their verdicts are kept and only the replays after them are run.

    .venv/bin/python benchmarks/policy_sweep.py --search 120 --parts wide --confirm 8 --confirm-replays 3
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import replays, wide_gangs  # noqa: E402
from benchmarks.sweep_search import search  # noqa: E402
from scheduler.policy import GpuState, PolicyConfig  # noqa: E402
from scheduler.sim import SimResult, TraceJob, simulate  # noqa: E402
from scheduler.sim.model import CLASSES, job_class  # noqa: E402

NARROW = ("1", "2-4")  # the classes the "below fifo-easy" goal leaves out (as `wide_gangs` does)


@dataclass(frozen=True)
class Week:
    name: str
    trace: list[TraceJob]
    gpus: list[GpuState]
    span: bool  # an engine that starts a job across nodes
    base: str = ""  # the week this one replays (`--replays`); its own name where empty


@dataclass(frozen=True)
class Verdict:
    asked: int  # goals asked on this week
    one_wait_s: float  # the 1-GPU mean wait to first start
    one_delay_s: float  # the 1-GPU mean delay (finish - submit - run)
    lost: float  # work lost, a share of the week's GPU-hours
    missed: tuple[str, ...]  # the goals missed, named
    met_range: tuple[int, int] | None = None  # over a week's replays (`combined`), the fewest and most met

    @property
    def met(self) -> int:
        """The goals met of those asked."""
        return self.asked - len(self.missed)


def grid(
    bounds_h: list[float],
    bonuses: list[float],
    longer: list[float | None],
    caps: list[int],
    shorts_h: list[float] | None = None,
    backlogs: list[float] | None = None,
    waited_h: list[float | None] | None = None,
) -> list[tuple[str, PolicyConfig]]:
    """Every combination, labelled by its settings (the bound on the whole wait in each). `shorts_h`:
    `short_job_s` values, hours (which single-GPU jobs the bonus lifts; one combination without it);
    `backlogs`: `gang_bound_backlog` values (the bound risen to k x the queue's backlog; 0: as set)."""
    combos, shorts_h, backlogs, waited_h = [], shorts_h or [1.0], backlogs or [0.0], waited_h or [None]
    for waited, backlog, bound, bonus, short, ratio, cap in itertools.product(
        waited_h, backlogs, bounds_h, bonuses, shorts_h, longer, caps
    ):
        if not bonus and short != shorts_h[0]:
            continue  # no bonus: which jobs it would lift changes nothing
        if waited is not None and ratio is not None:
            continue  # one or the other (`PolicyConfig.gang_stops_waited`)
        config = PolicyConfig(
            gang_max_wait_s=bound * 3600,
            gang_bound_backlog=backlog,
            gang_bound_whole_wait=True,
            short_job_bonus=bonus,
            short_job_s=short * 3600,
            gang_stops_longer=ratio,
            gang_max_preemptions=cap,
            gang_stops_waited=None if waited is None else waited * 3600,
        )
        lifted = f" (1-GPU jobs up to {short:g} h)" if bonus and len(shorts_h) > 1 else ""
        risen = f" or {backlog:g} x backlog" if backlog else ""
        label = (
            f"bound {bound:g} h{risen}, bonus {bonus:g}{lifted}, longer {'off' if ratio is None else f'{ratio:g}'}, {cap} stops"
            + ("" if waited is None else f", waited {waited:g} h")
        )
        combos.append((label, config))
    return combos


def weeks(seeds: list[int], parts: set[str], replays_each: int = 1) -> list[Week]:
    """The wide-gang week of each seed and its gang weeks (those in `parts`), each followed by its
    `replays_each` - 1 jittered copies (`benchmarks/replays.py`; drawn as `wide_gangs.py` draws them)."""
    found = []
    for seed in seeds:
        built = []
        if "wide" in parts:
            gpus = wide_gangs.wide_fleet()
            built.append(("wide", "wide 0.85", wide_gangs.wide_week(0.85, len(gpus), seed), gpus, True))
        if "gang" in parts:
            built += [(name, name, trace, gpus, False) for name, trace, gpus in wide_gangs.gang_weeks(seed)]
        for week, drawn_as, trace, gpus, span in built:
            name, tag = f"{week}, seed {seed}", wide_gangs.jitter_tag(drawn_as, seed)
            for k, draw in enumerate(replays.draws(trace, tag, replays_each)):
                found.append(Week(name if k == 0 else f"{name}, replay {k + 1}", draw, gpus, span, name))
    return found


def combined(verdicts: list[Verdict]) -> Verdict:
    """One week's verdicts over its replays: a goal missed unless more than half met it (a tie is a
    miss); the medians of the 1-GPU mean wait and delay and of the work lost; the range of goals met."""
    if len(verdicts) == 1:
        return verdicts[0]
    names = dict.fromkeys(name for v in verdicts for name in v.missed)
    missed = tuple(name for name in names if not replays.most(sum(name not in v.missed for v in verdicts), len(verdicts)))
    return Verdict(
        verdicts[0].asked,
        statistics.median(v.one_wait_s for v in verdicts),
        statistics.median(v.one_delay_s for v in verdicts),
        statistics.median(v.lost for v in verdicts),
        missed,
        (min(v.met for v in verdicts), max(v.met for v in verdicts)),
    )


def judge(result: SimResult, week: Week, floors: wide_gangs.Floors, easy: SimResult) -> Verdict:
    """`result` against issue 66's goals on `week` (module docstring)."""
    missed, asked = [], 0
    classes = [c for c in CLASSES if c != "1" and any(job_class(j.gpus) == c for j in week.trace)]
    for name in classes:
        asked += 1
        if result.class_delays.get(name, {}).get("max_s", 0.0) > wide_gangs.goal_s(floors, name):
            missed.append(name)
    wide = [c for c in classes if c not in NARROW]
    if wide:
        asked += 1
        ours = max(result.class_delays.get(c, {}).get("max_s", 0.0) for c in wide)
        if ours >= max(easy.class_delays.get(c, {}).get("max_s", 0.0) for c in wide):
            missed.append("below fifo-easy")
    one_wait = result.class_waits.get("1", {}).get("mean_s", 0.0)
    lost = result.lost_gpu_h / (sum(j.gpus * j.duration_s for j in week.trace) / 3600)
    for name, miss in (("1-GPU mean", one_wait > wide_gangs.GOAL_1_MEAN_S), ("lost", lost > wide_gangs.GOAL_LOST)):
        asked += 1
        if miss:
            missed.append(name)
    one_delay = result.class_delays.get("1", {}).get("mean_s", 0.0)
    return Verdict(asked, one_wait, one_delay, lost, tuple(missed))


def _replay(week: Week, combos: list[tuple[str, PolicyConfig]]) -> tuple[str, list[Verdict], float]:
    """One week: its floors, `fifo-easy`, then every combination (a worker's share of the sweep)."""
    started = time.perf_counter()
    floors = wide_gangs.floors_of(week.trace, week.gpus, week.span)
    easy = simulate(week.trace, week.gpus, "fifo-easy", PolicyConfig(span_nodes=week.span))
    verdicts = [
        judge(simulate(week.trace, week.gpus, "drape", replace(config, span_nodes=week.span)), week, floors, easy)
        for _, config in combos
    ]
    return week.name, verdicts, time.perf_counter() - started


def frontier(totals: dict[str, tuple[int, float]]) -> list[str]:
    """The labels no other beats on both (goals met, more is better) and (worst 1-GPU mean wait)."""
    return [
        label
        for label, (met, worst) in totals.items()
        if not any(m >= met and w <= worst and (m, w) != (met, worst) for m, w in totals.values())
    ]


def report(combos: list[tuple[str, PolicyConfig]], found: dict[str, list[Verdict]]) -> dict[str, tuple[int, float]]:
    """The table (a row per combination, a column per week), the frontier and the verdict; returns
    each combination's (goals met, worst 1-GPU mean wait) by label."""
    names = list(found)
    print("| combination | " + " | ".join(names) + " | goals met | worst 1-GPU mean wait |")
    print("|---|" + "---|" * (len(names) + 2))
    totals: dict[str, tuple[int, float]] = {}
    for index, (label, _) in enumerate(combos):
        row = [found[name][index] for name in names]
        met, asked, worst = sum(v.met for v in row), sum(v.asked for v in row), max(v.one_wait_s for v in row)
        totals[label] = (met, worst)
        cells = [
            f"{v.met}/{v.asked}{_spread(v)}; {v.one_wait_s / 60:.0f} ({v.one_delay_s / 60:.0f}) min; {100 * v.lost:.2f}%"
            for v in row
        ]
        print(f"| {label} | " + " | ".join(cells) + f" | {met}/{asked} | {worst / 60:.1f} min |")
    print(
        "\nEach cell: goals met / asked (over replays: met by more than half, [fewest-most met in one]); "
        "the 1-GPU mean wait (mean delay) in minutes; work lost (medians over replays)."
    )
    print("\n## The frontier (no combination meets more goals with a lower worst 1-GPU mean wait)\n")
    index_of = {label: index for index, (label, _) in enumerate(combos)}
    for label in sorted(frontier(totals), key=lambda label: -totals[label][0]):
        met, worst = totals[label]
        misses = sorted({m for name in names for m in found[name][index_of[label]].missed})
        print(f"- {label}: {met} goals met, worst 1-GPU mean wait {worst / 60:.1f} min; missed: {', '.join(misses) or 'none'}")
    print("\n## Per week: the most goals one combination met, and what those combinations missed\n")
    for name in names:
        print(f"- {name}: {per_week(found[name])}")
    every = [label for label, index in index_of.items() if all(not found[name][index].missed for name in names)]
    print(f"\nEvery goal on every week: {', '.join(every) if every else 'met by no combination'}")
    return totals


def best(
    combos: list[tuple[str, PolicyConfig]], totals: dict[str, tuple[int, float]], count: int
) -> list[tuple[str, PolicyConfig]]:
    """The `count` best of `combos` by `totals` (`report`'s): the most goals met, then the lowest worst
    1-GPU mean wait, then the order given (so a tie keeps the draw's order)."""
    order = sorted(range(len(combos)), key=lambda i: (-totals[combos[i][0]][0], totals[combos[i][0]][1], i))
    return [combos[i] for i in order[:count]]


def sweep(combos: list[tuple[str, PolicyConfig]], chosen: list[Week], workers: int) -> dict[str, list[list[Verdict]]]:
    """Every combination on every week of `chosen` (a process a week): by the week each replays
    (`Week.base`), its replays' verdicts in `chosen`'s order, each in `combos`' order."""
    each: dict[str, list[list[Verdict]]] = {}
    with ProcessPoolExecutor(workers) as pool:
        for week, (name, verdicts, took) in zip(chosen, pool.map(_replay, chosen, [combos] * len(chosen)), strict=True):
            each.setdefault(week.base or week.name, []).append(verdicts)
            print(f"{name}: {took:.0f} s", file=sys.stderr, flush=True)
    return each


def combine(each: dict[str, list[list[Verdict]]]) -> dict[str, list[Verdict]]:
    """`sweep`'s verdicts combined over each week's replays (`combined`), by week, in `combos`' order."""
    return {base: [combined(list(per)) for per in zip(*draws, strict=True)] for base, draws in each.items()}


def confirm(
    combos: list[tuple[str, PolicyConfig]],
    totals: dict[str, tuple[int, float]],
    screened: dict[str, list[list[Verdict]]],
    count: int,
    again: list[Week],
    workers: int,
) -> tuple[list[tuple[str, PolicyConfig]], dict[str, list[Verdict]]]:
    """The `count` best of the screen (`best`) on the weeks `again` (`weeks`' replays of each), combined.
    A week's first replays are the screen's (`screened`, `sweep`'s), drawn alike: their verdicts are
    kept, and only the replays after them are replayed."""
    confirmed, at = best(combos, totals, count), {label: index for index, (label, _) in enumerate(combos)}
    wanted = Counter(week.base or week.name for week in again)
    each = {
        base: [[draw[at[label]] for label, _ in confirmed] for draw in draws[: wanted[base]]] for base, draws in screened.items()
    }
    seen: Counter = Counter()
    fresh = []  # the replays the screen did not run
    for week in again:
        base = week.base or week.name
        seen[base] += 1
        if seen[base] > len(each.get(base, [])):
            fresh.append(week)
    for base, draws in sweep(confirmed, fresh, workers).items():
        each.setdefault(base, []).extend(draws)
    return confirmed, combine(each)


def per_week(verdicts: list[Verdict]) -> str:
    """One week's best: the most goals a combination met, how many met that many and what each of
    those missed (so a pair of goals no combination meets together shows), and any goal none met."""
    most = max(v.met for v in verdicts)
    top = [v for v in verdicts if v.met == most]
    missed = Counter(", ".join(v.missed) or "nothing" for v in top)
    never = [goal for goal in dict.fromkeys(g for v in verdicts for g in v.missed) if all(goal in v.missed for v in verdicts)]
    ways = "; ".join(f"{what} ({count})" for what, count in missed.most_common())
    return f"{most}/{top[0].asked} by {len(top)} of {len(verdicts)}, missing {ways}" + (
        f"; met by none: {', '.join(never)}" if never else ""
    )


def _spread(verdict: Verdict) -> str:
    return "" if verdict.met_range is None else f" [{verdict.met_range[0]}-{verdict.met_range[1]}]"


def _floats(text: str, what: str, low: float, high: float, off: bool = False) -> list:
    values: list = []
    for part in text.split(","):
        if off and part == "off":
            values.append(None)
            continue
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low <= value <= high):
            raise ValueError(f"{what}: expected numbers in [{low:g}, {high:g}]{' or off' if off else ''}, got {part!r}")
        values.append(value)
    return values


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1-3", help="seeds: 1-3 or 1,4")
    parser.add_argument("--parts", default="wide,gang", help="which weeks: wide, gang")
    parser.add_argument("--bound-hours", default="1,3,6", help="gang_max_wait_s values, hours")
    parser.add_argument("--bonus", default="0,20", help="short_job_bonus values")
    parser.add_argument("--longer", default="off,2", help="gang_stops_longer values (off: none)")
    parser.add_argument("--caps", default="4,16", help="gang_max_preemptions values")
    parser.add_argument("--backlog", default="0,0.5", help="gang_bound_backlog values (0: the bound as set)")
    parser.add_argument("--waited", default="off", help="gang_stops_waited values, hours (off: none)")
    parser.add_argument("--short-hours", default="1", help="short_job_s values, hours: the 1-GPU jobs the bonus lifts")
    parser.add_argument(
        "--replays", type=int, default=1, help=f"replays of each week, 1 to {replays.MAX_REPLAYS} (module docstring)"
    )
    parser.add_argument(
        "--search", type=int, default=0, help="replay this many combinations drawn from every setting instead of the grid"
    )
    parser.add_argument("--search-seed", type=int, default=1, help="which draw --search takes (the same seed, the same draw)")
    parser.add_argument("--confirm", type=int, default=0, help="replay the best this many again on --confirm-replays")
    parser.add_argument("--confirm-replays", type=int, default=3, help="replays of each week for --confirm")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes (a week each)")
    args = parser.parse_args(argv)
    try:
        combos = grid(
            _floats(args.bound_hours, "--bound-hours", 0.1, 48),
            _floats(args.bonus, "--bonus", 0, 100),
            _floats(args.longer, "--longer", 1, 1000, off=True),
            [int(c) for c in _floats(args.caps, "--caps", 0, 100)],
            _floats(args.short_hours, "--short-hours", 0, 96),
            _floats(args.backlog, "--backlog", 0, 10),
            _floats(args.waited, "--waited", 1 / 60, 168, off=True),
        )
    except ValueError as bad:
        parser.error(str(bad))
    if not 0 <= args.search <= 10_000:
        parser.error(f"--search: expected 0 (the grid) to 10000 combinations, got {args.search}")
    if args.search:
        combos = search(args.search, args.search_seed)
    parts = set(args.parts.split(",")) - {""}
    if unknown := parts - {"wide", "gang"}:
        parser.error(f"--parts: unknown {sorted(unknown)}; expected some of wide, gang")
    for option, value in (("--replays", args.replays), ("--confirm-replays", args.confirm_replays)):
        if not 1 <= value <= replays.MAX_REPLAYS:
            parser.error(f"{option}: expected 1 to {replays.MAX_REPLAYS}, got {value}")
    if not 0 <= args.confirm <= len(combos):
        parser.error(f"--confirm: expected 0 (none) to {len(combos)} (the combinations replayed), got {args.confirm}")
    if not 1 <= args.workers <= 64:
        parser.error(f"--workers: expected 1 to 64, got {args.workers}")
    low, _, high = args.seeds.partition("-")
    seeds = list(range(int(low), int(high) + 1)) if high else [int(s) for s in args.seeds.split(",")]
    load = os.getloadavg()
    print(f"machine load (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    started, chosen = time.perf_counter(), weeks(seeds, parts, args.replays)
    drawn = f" drawn from every setting (--search-seed {args.search_seed})" if args.search else ""
    print(f"{len(combos)} combinations{drawn} on {len(chosen)} weeks ({args.replays} replays each), {args.workers} workers\n")
    screened = sweep(combos, chosen, args.workers)
    totals = report(combos, combine(screened)) if screened else {}
    if args.confirm and screened:
        print(f"\n# Confirmed: the best {args.confirm} of the {len(combos)} on {args.confirm_replays} replays of each week\n")
        again = weeks(seeds, parts, args.confirm_replays)
        report(*confirm(combos, totals, screened, args.confirm, again, args.workers))
    load = os.getloadavg()
    took = time.perf_counter() - started
    print(f"\n{took:.0f} s in all; machine load (1, 5, 15 min) at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
