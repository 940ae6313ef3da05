"""benchmarks/wide_gangs.py at unit-test size: a small week on two nodes, every policy beside the class floors."""

from __future__ import annotations

import random

import pytest

from benchmarks import replays, wide_gangs
from scheduler.sim import SimResult, TraceJob


def _small_week(seed: int) -> list[TraceJob]:
    """1-16-GPU jobs over two hours on 16 GPUs: enough to make gangs wait."""
    rng, jobs = random.Random(seed), []
    for index in range(24):
        gpus = rng.choice((1, 1, 1, 2, 4, 8, 16))
        duration = rng.uniform(600, 3600) if gpus > 1 else rng.uniform(300, 7200)
        jobs.append(
            TraceJob(f"j{index:02d}", rng.uniform(0, 7200), duration, 70.0 if gpus > 1 else 30.0, gpus, 5 if gpus > 1 else 3, "x")
        )
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def test_every_policy_waits_at_least_the_floor_over_the_classes_and_the_summary_has_each_class(capsys):
    gpus = wide_gangs.fleet([("h", "H100-80GB", 80.0, 2)])
    for seed in (3,):
        trace = _small_week(seed)
        floors = wide_gangs.floors_of(trace, gpus, span=True, precision_s=1.0)
        rows = wide_gangs.table(f"small, seed {seed}", trace, gpus, bound_h=0.5, span=True)
        printed = capsys.readouterr().out
        assert "floor, 1-GPU mean delay <= 5 min" in printed and "against the goals" in printed
        for anyhow, beside in floors.values():
            assert 0.0 <= anyhow <= beside  # keeping the 1-GPU jobs only adds work
        # the max over the classes of any policy's max wait is at least the largest floor for any policy
        # (level 1 of class_floor.py: unconditional), in the simulator's own replay
        top = max(anyhow for anyhow, _ in floors.values())
        for row in rows:
            if row[2] not in ("1 (mean)", "work lost"):
                assert row[3].startswith(f"{floors[row[2]][0] / 3600:.1f} h /")
        classes = {row[2] for row in rows}
        assert {"1 (mean)", "work lost"} <= classes and len(rows[0]) == 5 + len(wide_gangs.policies(0.5, True))
        for label, policy, config in wide_gangs.policies(0.5, True):
            waits = wide_gangs.simulate(trace, gpus, policy, config).class_waits
            assert max(w["max_s"] for c, w in waits.items() if c != "1") > top - 1e-6, label


def test_with_replays_the_tables_give_medians_and_each_goal_counts_the_replays_that_meet_it(capsys):
    gpus, trace = wide_gangs.fleet([("h", "H100-80GB", 80.0, 2)]), _small_week(3)
    only = ("bound", "fifo-easy")
    rows = wide_gangs.table("small", trace, gpus, bound_h=0.5, span=True, only=only, replays_each=3, tag="t/1")
    printed = capsys.readouterr().out
    assert "medians over 3 replays" in printed and "of 3 replays)" in printed
    label, policy, config = wide_gangs.policies(0.5, True, ("bound",))[0]
    runs = [wide_gangs.simulate(d, gpus, policy, config) for d in replays.draws(trace, "t/1", 3)]
    middle = wide_gangs.median_result(runs)
    for c, delays in middle.class_delays.items():
        assert delays["max_s"] == sorted(r.class_delays[c]["max_s"] for r in runs)[1]
    assert middle.of_bound == sorted(r.of_bound for r in runs)[1]
    assert wide_gangs.median_result(runs[:1]) is runs[0]
    lost = [row for row in rows if row[2] == "work lost"][0]
    assert lost[5] == f"{100 * middle.lost_gpu_h / (sum(j.gpus * j.duration_s for j in trace) / 3600):.2f}%"
    with pytest.raises(SystemExit) as stopped:
        wide_gangs.main(["--replays", "0", "--parts", ""])
    assert stopped.value.code == 2 and "--replays: expected 1 to 25, got 0" in capsys.readouterr().err


def test_the_wide_load_and_the_policies_are_checked():
    for bad in (["--wide-load", "nan"], ["--policies", "rehome,fifo"]):
        with pytest.raises(SystemExit) as stopped:
            wide_gangs.main([*bad, "--parts", ""])
        assert stopped.value.code == 2
    chosen = [label for label, *_ in wide_gangs.policies(3, True, ("rehome", "none"))]
    assert chosen == ["drape, bound 3 h, rehome", "drape, no bound"]


def _shared(policy: str, of_bound: float, of_shortest: float, starved: int) -> SimResult:
    """A sharing week's result: `of_bound` of a bound of 1, `of_shortest` of a 100-h shortest makespan."""
    makespan = 100 * 3600 / of_shortest
    return SimResult(policy, 10, 8, of_bound, 0.5, 0.0, 0.0, starved, makespan, 1.0, {}, shortest_s=100 * 3600)


@pytest.mark.parametrize(
    ("drape", "reference", "met"),
    [
        ((0.90, 1.000, 52), (1.000, 1.000, 1387), True),  # packed: under the busy-GPU bound, at the shortest makespan
        ((0.83, 0.914, 333), (0.835, 0.835, 1604), False),  # ahead of the reference, under 0.93
        ((0.95, 0.950, 40), (0.97, 0.970, 900), False),  # behind the reference's share
        ((0.95, 0.950, 901), (0.95, 0.950, 900), False),  # more starved
    ],
)
def test_the_sharing_goals_are_judged_on_the_shortest_makespan(drape, reference, met, capsys):
    found = {"drape": _shared("drape", *drape), "fifo-backfill": _shared("fifo-backfill", *reference)}
    assert wide_gangs.sharing_verdict(found) is met
    out = capsys.readouterr().out
    assert f"{drape[1]:.3f} of the shortest makespan ({drape[0]:.3f} of the busy-GPU bound)" in out
    assert ("not behind" in out) is (drape[1] >= reference[1] and drape[2] <= reference[2])


def test_a_sharing_week_is_replayed_and_judged_on_its_medians(monkeypatch, capsys):
    """~2 s. `--replays` reaches the sharing weeks: each policy's row gives the median share of the
    shortest makespan within its range over the replays, and the verdict reads the medians."""
    gpus = wide_gangs.fleet([("t", "T4-16GB", 16.0, 1), ("a", "A10-24GB", 24.0, 1)])
    rng, trace = random.Random(5), []
    for i in range(40):  # a quarter T4-only
        submit, duration, width = rng.uniform(0, 3 * 3600), rng.uniform(600, 7200), rng.choice((1, 1, 4))
        trace.append(TraceJob(f"j{i:02d}", submit, duration, 10.0, width, 3, "x", ("T4",) if i % 4 == 0 else ()))
    trace.sort(key=lambda j: (j.submit_s, j.job_id))
    monkeypatch.setattr(wide_gangs, "sharing_week", lambda seed, small: (trace, gpus))
    met = wide_gangs.sharing(1, False, 3)
    out = capsys.readouterr().out
    assert "### sharing week, T4-only jobs, T4 + A10, seed 1: 40 jobs on 16 GPUs, 3 replays" in out
    rows = {line.split(" | ")[0][2:]: line for line in out.splitlines() if line.startswith("| ") and "---" not in line}
    assert set(wide_gangs.SHARING_POLICIES) <= set(rows)
    for name in wide_gangs.SHARING_POLICIES:
        share = rows[name].split(" | ")[2]
        low, high = (float(x) for x in share.split("[")[1].rstrip("]").split("-"))
        assert low <= float(share.split(" ")[0]) <= high, rows[name]
    drape = float(rows["drape"].split(" | ")[2].split(" ")[0])
    assert f"drape: {drape:.3f} of the shortest makespan" in out and met is (
        drape >= 0.93 and "NOT met" not in out and "not behind" in out
    )


def test_alone_prints_each_policy_beside_the_floor_and_first_come_first_served(monkeypatch, capsys):
    """`--parts alone` on one node of 8 H100: 10-h 8-GPU jobs at t=0 and t=100, a 1-h one at t=200,
    and a single-GPU job it leaves out. First-come-first-served the short one waits 19.9 h; balanced
    waits (`gang_stops_waited` 2 h) cut the largest delay, never under the floor. ~0.1 s."""
    from scheduler.policy import GpuState

    node = [GpuState(f"h/gpu{i}", "h", "H100-80GB", 80.0) for i in range(8)]
    week = [
        TraceJob("a", 0.0, 36000.0, 70.0, 8, 5, "stage"),
        TraceJob("b", 100.0, 36000.0, 70.0, 8, 5, "stage"),
        TraceJob("c", 200.0, 3600.0, 70.0, 8, 5, "stage"),
        TraceJob("s", 300.0, 600.0, 30.0, 1, 3, "gate"),
    ]
    monkeypatch.setattr(wide_gangs, "gang_weeks", lambda seed: [("one node", week, node)])
    wide_gangs.main(["--seeds", "1", "--parts", "alone"])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| one node"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "3 on 1" and cells[3] == "19.9 h"  # c waits for a and b: 72,000 - 200 s
    delays = [float(cell.split(" h")[0]) for cell in cells[4:-2]]  # no bound, backlog, waited, backlog + waited
    floor = float(cells[2].split(" h")[0])
    assert delays[0] == 19.9 and all(d >= floor for d in delays) and delays[2] < delays[0] / 1.5
    assert "(0, 0.00%)" in cells[4] and "(0, 0.00%)" not in cells[6]  # first-come-first-served stops nothing
    # one node: no floor on a node fewer; s (in its window 300-900 s) is after the gangs' arrivals (0-200 s)
    assert cells[-2:] == ["-", "0.1 of 0.1"]


def test_pinned_hours_count_the_arrival_hours_with_no_single_gpu_job_bound_to_the_gang_nodes():
    """Two H100 nodes (the gangs') and an L40S one; gangs arrive at 0 and 10 h. Pinned: a single-GPU job
    no GPU off the gang nodes can hold (H100-only, or too big for 48 GiB); not one the L40S holds."""
    gpus = wide_gangs.fleet([("h", "H100-80GB", 80.0, 2), ("l", "L40S-48GB", 48.0, 1)])
    usable = [g for g in gpus if g.model.startswith("H100")]
    gangs = [TraceJob("g1", 0.0, 3600.0, 70.0, 8, 5, "stage"), TraceJob("g2", 36000.0, 3600.0, 70.0, 8, 5, "stage")]
    week = [
        *gangs,
        TraceJob("pinned", 3600.0, 7200.0, 30.0, 1, 3, "svc", ("H100",)),  # 1-3 h
        TraceJob("big", 18000.0, 3600.0, 60.0, 1, 3, "svc"),  # 5-6 h: 60 GiB fits no L40S
        TraceJob("free", 25200.0, 7200.0, 30.0, 1, 3, "svc"),  # 7-9 h: an L40S holds it
        TraceJob("late", 35000.0, 9000.0, 30.0, 1, 3, "svc", ("H100",)),  # from 9.72 h, past the last arrival
    ]
    without, span = wide_gangs.pinned_hours(week, gpus, usable, gangs)
    assert span == 10.0 and without == pytest.approx(10.0 - 2.0 - 1.0 - (10.0 - 35000.0 / 3600))
    everything, _ = wide_gangs.pinned_hours(week, gpus, gpus, gangs)  # every GPU the gangs': "free" pins too
    assert everything == pytest.approx(without - 2.0)
