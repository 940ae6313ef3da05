"""benchmarks/policy_sweep.py at unit-test size: the grid, the judging against the goals, the frontier."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from benchmarks import policy_sweep, replays, sweep_search, wide_gangs
from drape.config import QueueConfig
from scheduler.dispatch.fleet import policy_config
from scheduler.policy import PolicyConfig
from scheduler.sim import SimResult, TraceJob, simulate
from tests.unit.test_wide_gangs import _small_week


def test_the_grid_has_every_combination_with_the_bound_on_the_whole_wait():
    combos = policy_sweep.grid([2.0, 3.0], [0.0, 20.0], [None, 2.0, 4.0], [4, 16])
    assert len(combos) == 24 and len({label for label, _ in combos}) == 24
    label, config = combos[-1]
    assert label == "bound 3 h, bonus 20, longer 4, 16 stops"
    assert config.gang_max_wait_s == 3 * 3600 and config.gang_bound_whole_wait
    assert (config.short_job_bonus, config.gang_stops_longer, config.gang_max_preemptions) == (20.0, 4.0, 16)
    assert combos[0][1].gang_stops_longer is None and "longer off" in combos[0][0]
    lifted = policy_sweep.grid([3.0], [0.0, 20.0], [None], [4], [1.0, 96.0])
    assert [label for label, _ in lifted] == [  # without the bonus, which jobs it lifts changes nothing
        "bound 3 h, bonus 0, longer off, 4 stops",
        "bound 3 h, bonus 20 (1-GPU jobs up to 1 h), longer off, 4 stops",
        "bound 3 h, bonus 20 (1-GPU jobs up to 96 h), longer off, 4 stops",
    ]
    assert [config.short_job_s for _, config in lifted] == [3600.0, 3600.0, 96 * 3600.0]
    risen = policy_sweep.grid([1.0], [20.0], [2.0], [8], backlogs=[0.0, 0.5])
    assert [label for label, _ in risen] == [
        "bound 1 h, bonus 20, longer 2, 8 stops",
        "bound 1 h or 0.5 x backlog, bonus 20, longer 2, 8 stops",
    ]
    assert [config.gang_bound_backlog for _, config in risen] == [0.0, 0.5]
    waited = policy_sweep.grid([2.0], [20.0], [None, 2.0], [8], waited_h=[None, 6.0])
    assert [label for label, _ in waited] == [  # with `longer` the policy refuses it: left out
        "bound 2 h, bonus 20, longer off, 8 stops",
        "bound 2 h, bonus 20, longer 2, 8 stops",
        "bound 2 h, bonus 20, longer off, 8 stops, waited 6 h",
    ]
    assert [config.gang_stops_waited for _, config in waited] == [None, None, 6 * 3600.0]


def test_a_search_draws_distinct_combinations_the_policy_accepts_the_same_for_a_seed():
    drawn = sweep_search.search(40, 1)
    assert len(drawn) == 40 and len({label for label, _ in drawn}) == 40
    assert [label for label, _ in drawn] == [label for label, _ in sweep_search.search(40, 1)]
    assert [label for label, _ in drawn] != [label for label, _ in sweep_search.search(40, 2)]
    seen: dict[str, set] = {name: set() for name in sweep_search.SPACE}
    for label, config in drawn:
        assert config.gang_bound_whole_wait
        for name, values in sweep_search.SPACE.items():
            assert getattr(config, name) in values, (name, label)
            seen[name].add(getattr(config, name))
        assert config.gang_stops_waited is None or config.gang_stops_longer is None  # mended, as the policy asks
        assert config.gang_max_wait_s is not None or config.gang_bound_backlog == 0.0
        assert config.short_job_bonus or config.short_job_s == 3600.0
        assert f"{config.max_jobs_per_gpu} per GPU" in label and f"{config.gang_max_preemptions} stops" in label
        assert ("rehome" in label) == config.gang_stops_rehome
    assert all(len(values) > 1 for values in seen.values())  # 40 draws reach more than one value of each
    # 10 minutes reads as minutes, not 0.166667 h
    with_minutes = [label for label, config in drawn if config.preempt_after_s == 600.0]
    assert with_minutes and all("moves after 10 min" in label for label in with_minutes)


def test_per_week_shows_two_goals_no_combination_meets_together():
    v = policy_sweep.Verdict
    verdicts = [
        v(4, 60.0, 90.0, 0.002, ("5-8",)),
        v(4, 600.0, 700.0, 0.002, ("1-GPU mean",)),
        v(4, 1.0, 1.0, 0.02, ("5-8", "lost")),
    ]
    assert policy_sweep.per_week(verdicts) == "3/4 by 2 of 3, missing 5-8 (1); 1-GPU mean (1)"
    assert policy_sweep.per_week(verdicts[:1] + verdicts[2:]) == "3/4 by 1 of 2, missing 5-8 (1); met by none: 5-8"
    assert policy_sweep.per_week([v(4, 1.0, 1.0, 0.0, ())]) == "4/4 by 1 of 1, missing nothing (1)"


def test_the_searched_setting_is_the_one_docs_queue_md_gives_for_a_pipeline_config():
    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "queue.md").read_text().split())
    found = re.search(r"In a pipeline config it reads .*?: `(queue: \{[^`]*\})`", text)
    assert found, "docs/queue.md: the searched setting's config is gone"
    queue = QueueConfig(**yaml.safe_load(found.group(1))["queue"])
    ours = policy_config(SimpleNamespace(queue=queue))
    label, _, searched = wide_gangs.policies(3.0, False, ("searched",))[0]
    assert ours == searched, label
    assert (ours.gang_stops_waited, ours.gang_max_wait_s, ours.preempt_after_s) == (7200.0, 3600.0, None)


def _result(delays: dict[str, float], one_wait_s: float, lost_gpu_h: float = 0.0) -> SimResult:
    classes = {c: {"jobs": 1, "mean_s": d, "p95_s": d, "max_s": d} for c, d in delays.items()}
    waits = {"1": {"jobs": 1, "mean_s": one_wait_s, "p95_s": 0.0, "max_s": 0.0}}
    return SimResult("drape", 2, 16, 0.5, 0.5, 0.0, 0.0, 0, 0.0, 1.0, {}, waits, lost_gpu_h=lost_gpu_h, class_delays=classes)


def test_judge_names_each_goal_missed_and_counts_those_asked():
    trace = [TraceJob("a", 0.0, 3600.0, 70.0, 1, 3, "x"), TraceJob("b", 0.0, 3600.0, 70.0, 8, 5, "x")]
    week = policy_sweep.Week("w", trace, wide_gangs.fleet([("h", "H100-80GB", 80.0, 1)]), False)
    floors = {"5-8": (3600.0, 4 * 3600.0)}  # goal: 1.25 x 4 h = 5 h
    easy = _result({"5-8": 6 * 3600.0}, 0.0)
    good = policy_sweep.judge(_result({"5-8": 5 * 3600.0}, 300.0, 0.09), week, floors, easy)
    assert (good.met, good.asked, good.missed) == (4, 4, ())  # 5-8, below fifo-easy, 1-GPU mean, lost
    bad = policy_sweep.judge(_result({"5-8": 5 * 3600.0 + 1}, 301.0, 0.11), week, floors, _result({"5-8": 5 * 3600.0}, 0.0))
    assert (bad.met, bad.asked) == (0, 4)
    assert bad.missed == ("5-8", "below fifo-easy", "1-GPU mean", "lost")  # 0.11 GPU-h of 9 is 1.2%


def test_the_frontier_keeps_only_combinations_nothing_beats_on_both():
    totals = {"a": (10, 600.0), "b": (12, 900.0), "c": (9, 900.0), "d": (10, 600.0), "e": (8, 60.0)}
    assert policy_sweep.frontier(totals) == ["a", "b", "d", "e"]  # c: a meets more with less wait


def test_a_small_sweep_judges_each_combination_as_a_replay_does(capsys):
    trace = _small_week(3)
    week = policy_sweep.Week("small", trace, wide_gangs.fleet([("h", "H100-80GB", 80.0, 2)]), True)
    combos = policy_sweep.grid([0.5], [0.0], [None, 2.0], [4])
    name, verdicts, _ = policy_sweep._replay(week, combos)
    assert name == "small" and len(verdicts) == 2
    for (_, config), verdict in zip(combos, verdicts, strict=True):
        again = simulate(trace, week.gpus, "drape", replace(config, span_nodes=True))
        assert verdict.one_wait_s == pytest.approx(again.class_waits["1"]["mean_s"])
        assert 0 <= verdict.met <= verdict.asked == len(verdict.missed) + verdict.met
    policy_sweep.report(combos, {name: verdicts})
    printed = capsys.readouterr().out
    assert "bound 0.5 h, bonus 0, longer 2, 4 stops" in printed and "Every goal on every week:" in printed
    assert "- small: " in printed.split("## Per week")[1]  # the week's best, after the frontier


def test_best_ranks_by_goals_met_then_the_worst_1_gpu_wait_then_the_order_given():
    combos = [(name, PolicyConfig()) for name in ("a", "b", "c", "d", "e")]
    totals = {"a": (10, 600.0), "b": (12, 900.0), "c": (10, 300.0), "d": (12, 900.0), "e": (3, 1.0)}
    assert [label for label, _ in policy_sweep.best(combos, totals, 3)] == ["b", "d", "c"]
    assert [label for label, _ in policy_sweep.best(combos, totals, 9)] == ["b", "d", "c", "a", "e"]


def test_confirm_replays_the_best_of_the_screen_again_on_more_replays(monkeypatch, capsys):
    week = _small_week(3)
    gpus = wide_gangs.fleet([("h", "H100-80GB", 80.0, 2)])
    combos = policy_sweep.grid([0.5, 3.0], [0.0], [None, 2.0], [4])
    asked: list[tuple[int, int]] = []

    def small_weeks(seeds, parts, replays_each=1):
        asked.append((len(seeds), replays_each))
        draws = replays.draws(week, "small", replays_each)
        return [policy_sweep.Week(f"small, {k}", draw, gpus, True, "small") for k, draw in enumerate(draws)]

    monkeypatch.setattr(policy_sweep, "weeks", small_weeks)
    monkeypatch.setattr(policy_sweep, "search", lambda count, seed: combos[:count])
    policy_sweep.main(["--search", "4", "--confirm", "2", "--confirm-replays", "3", "--seeds", "1", "--workers", "1"])
    printed = capsys.readouterr().out
    assert asked == [(1, 1), (1, 3)]  # the screen on one replay, then the confirmation on three
    screen, confirmed = printed.split("# Confirmed: the best 2 of the 4 on 3 replays of each week")
    rows = [line for line in confirmed.splitlines() if line.startswith("| bound")]
    assert len(rows) == 2 and all(" [" in row for row in rows)  # each cell gives its range over 3 replays
    screened = {line.split(" | ")[0][2:]: line for line in screen.splitlines() if line.startswith("| bound")}
    assert len(screened) == 4 and {row.split(" | ")[0][2:] for row in rows} <= set(screened)


def test_replays_are_jittered_copies_and_a_goal_counts_where_most_replays_meet_it():
    built = policy_sweep.weeks([1], {"gang"}, 3)
    assert [w.name for w in built[:3]] == [
        "64 H100, load 0.85, seed 1",
        "64 H100, load 0.85, seed 1, replay 2",
        "64 H100, load 0.85, seed 1, replay 3",
    ]
    assert {w.base for w in built[:3]} == {"64 H100, load 0.85, seed 1"} and len(built) == 9
    first, second = built[0].trace, built[1].trace
    assert len(first) == len(second) and second != first
    before = {j.job_id: j for j in first}
    for job in second:  # the same jobs, each submit moved by at most a minute
        assert abs(job.submit_s - before[job.job_id].submit_s) <= replays.JITTER_S
        assert replace(job, submit_s=before[job.job_id].submit_s) == before[job.job_id]
    assert policy_sweep.weeks([1], {"gang"}, 3)[1].trace == second  # drawn by week and replay: runs repeat
    tag = wide_gangs.jitter_tag("64 H100, load 0.85", 1)  # the same replay as wide_gangs.py's of that week
    assert replays.draws(first, tag, 2)[1] == second
    v = policy_sweep.Verdict
    three = [v(4, 60.0, 90.0, 0.002, ("5-8",)), v(4, 600.0, 700.0, 0.02, ("5-8", "lost")), v(4, 120.0, 80.0, 0.004, ())]
    both = policy_sweep.combined(three)
    assert both.missed == ("5-8",) and both.met == 3 and both.met_range == (2, 4)  # lost: missed by 1 of 3
    assert (both.one_wait_s, both.one_delay_s, both.lost) == (120.0, 90.0, 0.004)  # medians
    assert policy_sweep.combined(three[:1]) is three[0]
    # "lost" met by 1 of 2, which is not more than half: a tie is a miss, as wide_gangs.py counts it
    assert policy_sweep.combined(three[:2]).missed == ("5-8", "lost")
    assert policy_sweep.combined(three[:2]).met == 2
    with pytest.raises(ValueError, match="replays: expected 1 to 25, got 26"):
        replays.draws(first, "x", 26)


@pytest.mark.parametrize(
    "bad",
    [
        ["--bonus", "nan"],
        ["--backlog", "11"],
        ["--longer", "0.5"],
        ["--caps", "x"],
        ["--parts", "wide,sharing"],
        ["--workers", "0"],
        ["--replays", "0"],
        ["--search", "-1"],
        ["--confirm-replays", "0"],
        ["--confirm", "49"],
    ],
)
def test_bad_arguments_are_refused_naming_the_option(bad, capsys):
    with pytest.raises(SystemExit) as stopped:
        policy_sweep.main([*bad, "--seeds", "1"])
    assert stopped.value.code == 2
    assert bad[0] in capsys.readouterr().err
