"""benchmarks/hetero_sites.py: its sites and weeks as its docstring says, and its verdicts as judged."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks import hetero_sites
from scheduler.sim import SimResult, TraceJob
from scheduler.sim.model import check_fits


def test_each_site_has_its_node_shapes_and_names_unlike_the_other_benchmarks():
    shapes = {
        name: Counter((g.model, sum(1 for o in hetero_sites.site(name) if o.node == g.node)) for g in hetero_sites.site(name))
        for name in hetero_sites.SITES
    }
    assert shapes["three models"] == {(hetero_sites.H100, 8): 24, (hetero_sites.A100, 4): 8, (hetero_sites.L40S, 3): 9}
    assert sum(shapes["two generations"].values()) == 96 and sum(shapes["small nodes"].values()) == 80
    nodes = {g.node for g in hetero_sites.site("three models")}
    assert "dgx-h100.r07-n00" in nodes and "l40s-pcie.02" in nodes


@pytest.mark.parametrize("name", ["three models", "small nodes"])
def test_a_week_runs_on_its_site_at_the_load_asked_with_every_priority_at_every_width(name):
    gpus = hetero_sites.site(name)
    week = hetero_sites.week(gpus, 0.5, seed=7)
    check_fits(week, gpus, span=True)  # every job can run on the site as a gang across nodes
    assert week == sorted(week, key=lambda j: (j.submit_s, j.job_id)) and week == hetero_sites.week(gpus, 0.5, seed=7)
    offered = sum(j.gpus * j.duration_s for j in week) / (len(gpus) * hetero_sites.WEEK_S)
    assert 0.45 < offered < 0.75  # the shares' last jobs overshoot a little
    gangs = [j for j in week if j.gpus >= hetero_sites.WIDE]
    assert {j.priority for j in gangs} == {0, 1, 5} and {j.priority for j in week if j.gpus == 1} == {0, 1, 5}
    assert any(j.models == ("H100",) for j in gangs) and not any(j.models for j in week if j.gpus == 1)
    widest = max(j.gpus for j in week)
    assert widest == (16 if name == "three models" else 32)  # no 32-GPU gang fits three models: 16 instead


def _result(delays: dict[str, float]) -> SimResult:
    return SimResult("drape", len(delays), 8, 0.5, 0.5, 0.0, 0.0, 0, 1.0, 1.0, {}, job_delays=delays)


def test_the_gangs_max_is_over_gangs_of_eight_or_more_per_priority_and_the_verdicts_count_replays():
    trace = [
        TraceJob("a", 0, 60, 10, 8, 5, "x"),
        TraceJob("b", 0, 60, 10, 16, 0, "x"),
        TraceJob("c", 0, 60, 10, 4, 5, "x"),  # narrower than a gang: left out
    ]
    result = _result({"a": 3600.0, "b": 7200.0, "c": 99999.0})
    assert hetero_sites.gang_max(result, trace) == 7200.0
    assert hetero_sites.gang_max(result, trace, 5) == 3600.0 and hetero_sites.gang_max(result, trace, 1) == 0.0
    ours = [
        {"gangs: max (h)": 1.0, "p5 (h)": 2.0, "p1 (h)": 0.0, "p0 (h)": 1.0},
        {"gangs: max (h)": 0.5, "p5 (h)": 2.0, "p1 (h)": 0.0, "p0 (h)": 6.0},
        {"gangs: max (h)": 9.0, "p5 (h)": 9.0, "p1 (h)": 0.0, "p0 (h)": 9.0},
    ]
    theirs = [{"gangs: max (h)": 1.0, "p5 (h)": 2.0, "p1 (h)": 0.0, "p0 (h)": 5.0}] * 3
    said = hetero_sites.judge({"drape": ours, "fifo-easy": theirs, "priority-easy": theirs}, "drape")
    # below fifo-easy is strict (a tie is not below: 1 of 3); not above priority-easy counts a tie
    assert said == [
        "below fifo-easy: NO (1 of 3)",
        "p5 <= priority-easy: yes (2 of 3)",
        "p1 <= priority-easy: yes (3 of 3)",
        "p0 <= priority-easy: NO (1 of 3)",
    ]


def test_bad_arguments_are_refused_with_what_was_expected(capsys):
    for argv, expected in (
        (["--sites", "moon base"], "--sites: unknown ['moon base']"),
        (["--load", "nan"], "--load: expected a number in (0, 2]"),
        (["--aging", "fast"], "--aging: expected rates such as 0,0.25"),
        (["--aging", "-1"], "--aging: expected rates in [0, 1000]"),
        (["--seeds", "a-b"], "--seeds: expected a range"),
        (["--replays", "0"], "--replays: expected 1 to"),
    ):
        with pytest.raises(SystemExit) as stopped:
            hetero_sites.main(argv)
        assert stopped.value.code == 2 and expected in capsys.readouterr().err
