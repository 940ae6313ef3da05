"""`benchmarks/policy_sweep.py --search N`: combinations drawn at random from every setting the gang
weeks answer to, where the grid takes the product of a few (module docstring there)."""

from __future__ import annotations

import random

from scheduler.policy import PolicyConfig

# `--search`: every setting the gang weeks answer to, and the values drawn for each (None: off)
SPACE: dict[str, tuple] = {
    "gang_max_wait_s": (None, 1800.0, 3600.0, 7200.0, 10800.0, 21600.0),
    "gang_bound_backlog": (0.0, 0.25, 0.5, 1.0),
    "short_job_bonus": (0.0, 5.0, 20.0, 50.0),
    "short_job_s": (3600.0, 7200.0),
    "gang_stops_longer": (None, 2.0, 4.0),
    "gang_stops_waited": (None, 3600.0, 7200.0, 14400.0, 21600.0),
    "gang_max_preemptions": (4, 8, 16),
    "gang_stops_rehome": (False, True),
    "max_jobs_per_gpu": (2, 3, 4),
    "preempt_after_s": (None, 600.0, 1200.0, 3600.0),
    "max_preemptions": (2, 4, 8),
    "spread_after_s": (None, 1800.0, 3600.0),
    "aging_per_hour": (0.5, 1.0, 2.0, 4.0),
}


def search(count: int, seed: int) -> list[tuple[str, PolicyConfig]]:
    """`count` distinct combinations drawn from `SPACE` (each setting uniformly; the bound on the
    whole wait in each), the same for a seed: a wider look than the grid's product, over the settings
    the grid holds fixed too. A draw the policy would refuse is mended, not dropped: `gang_stops_waited`
    with `gang_stops_longer` keeps the first; without a bound, no backlog."""
    rng, combos, seen = random.Random(f"policy-sweep/{seed}"), [], set()
    for _ in range(count * 50):
        if len(combos) == count:
            break
        drawn = {name: rng.choice(values) for name, values in SPACE.items()}
        if drawn["gang_stops_waited"] is not None:
            drawn["gang_stops_longer"] = None
        if drawn["gang_max_wait_s"] is None:
            drawn["gang_bound_backlog"] = 0.0
        if not drawn["short_job_bonus"]:
            drawn["short_job_s"] = SPACE["short_job_s"][0]
        key = tuple(drawn.values())
        if key not in seen:
            seen.add(key)
            combos.append((_label(drawn), PolicyConfig(gang_bound_whole_wait=True, **drawn)))
    return combos


def _label(drawn: dict) -> str:
    """A drawn combination as `grid` labels its own, with the settings the grid holds fixed after it."""

    def hours(seconds: float | None) -> str:
        if seconds is None:
            return "off"
        return f"{seconds / 60:g} min" if seconds < 3600 else f"{seconds / 3600:g} h"

    bound, backlog = drawn["gang_max_wait_s"], drawn["gang_bound_backlog"]
    risen = f" or {backlog:g} x backlog" if backlog else ""
    lifted = f" (1-GPU jobs up to {hours(drawn['short_job_s'])})" if drawn["short_job_bonus"] else ""
    longer = drawn["gang_stops_longer"]
    return (
        f"bound {hours(bound)}{risen}, bonus {drawn['short_job_bonus']:g}{lifted}, "
        f"longer {'off' if longer is None else f'{longer:g}'}, {drawn['gang_max_preemptions']} stops, "
        f"waited {hours(drawn['gang_stops_waited'])}{', rehome' if drawn['gang_stops_rehome'] else ''}; "
        f"{drawn['max_jobs_per_gpu']} per GPU, moves after {hours(drawn['preempt_after_s'])} "
        f"({drawn['max_preemptions']} each), spread after {hours(drawn['spread_after_s'])}, aging {drawn['aging_per_hour']:g}/h"
    )
