"""configs/queue/gang-waits.yaml, the queue overlay for gang fleets: what it sets reaches the policy through a
real config chain, it is the setting the benchmarks measured, and a broken overlay is refused by name."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from benchmarks import hetero_sites, openb_week, wide_gangs
from drape.config import EXAMPLE_SITE, ConfigError, load_config
from scheduler.dispatch.fleet import policy_config
from scheduler.policy import PolicyConfig

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "configs" / "queue" / "gang-waits.yaml"


def test_the_overlay_is_aged_with_the_bonus_for_jobs_up_to_2_h_and_8_stops():
    """The setting benchmarks/README.md reports (47 of 63 goals): "aged", short_job_s 7200, 8 stops a job."""
    assert wide_gangs.OVERLAY == OVERLAY
    for span in (False, True):
        (label, policy, shipped), (_, _, aged) = wide_gangs.policies(1.0, span, ("overlay", "aged"))
        assert (
            policy == "drape"
            and label.startswith("drape, bound 1 h or 0.5 x backlog")
            and label.endswith("configs/queue/gang-waits.yaml")
        )
        assert shipped == replace(aged, short_job_s=7200.0, gang_max_preemptions=8)
        assert shipped.span_nodes is span and shipped != PolicyConfig(span_nodes=span)
    hetero = {name: (policy, config) for name, policy, config in hetero_sites.settings()}
    assert hetero["overlay"] == ("drape", wide_gangs.overlay(True))
    assert openb_week.POLICIES["overlay"] == ("drape", wide_gangs.overlay(False))
    assert "overlay" in wide_gangs.SHARING_POLICIES


@pytest.mark.parametrize("cluster", ["slurm.yaml", "h100.yaml"])
def test_a_config_extending_a_cluster_and_the_overlay_runs_the_queue_with_its_settings(tmp_path, cluster):
    configs = REPO / "configs"
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"extends": [str(configs / cluster), str(OVERLAY)], "name": "mine"}))
    cfg = load_config(mine, site=EXAMPLE_SITE)
    for key, value in yaml.safe_load(OVERLAY.read_text())["queue"].items():
        assert getattr(cfg.queue, key) == value, key
    ours, plain = policy_config(cfg), policy_config(load_config(configs / cluster, site=EXAMPLE_SITE))
    # the engine's own settings stay the cluster's (one job a GPU on both); the gang settings are the overlay's
    assert ours == replace(wide_gangs.overlay(cluster == "slurm.yaml"), max_jobs_per_gpu=plain.max_jobs_per_gpu)
    assert plain.gang_aging_whole_wait is False and plain.gang_max_wait_s is None  # opt-in: the cluster alone has none


def test_a_broken_overlay_is_refused_naming_the_file_and_what_is_wrong(tmp_path):
    typo = tmp_path / "typo.yaml"
    typo.write_text("queue:\n  gang_aging_whole_waits: true\n")
    with pytest.raises(ConfigError, match=r"typo\.yaml: queue\.gang_aging_whole_waits: Extra inputs are not permitted"):
        wide_gangs.overlay(False, typo)
    extra = tmp_path / "extra.yaml"
    extra.write_text("queue: {short_job_bonus: 20}\ntrain: {}\n")
    with pytest.raises(ConfigError, match=r"extra\.yaml: expected a mapping with one key, queue .*'train'"):
        wide_gangs.overlay(False, extra)
    bounded = tmp_path / "bounded.yaml"
    bounded.write_text("queue: {short_job_bonus: 500}\n")
    with pytest.raises(ConfigError, match=r"bounded\.yaml: queue\.short_job_bonus: Input should be less than or equal to 100"):
        wide_gangs.overlay(False, bounded)
    with pytest.raises(ConfigError, match=r"missing\.yaml: queue overlay file not found"):
        wide_gangs.overlay(False, tmp_path / "missing.yaml")


def test_drape_queue_simulate_replays_a_config_with_the_overlay_and_names_the_overlay_run_alone(tmp_path, monkeypatch):
    """The docs' what-if: a config extending the Slurm config and the overlay replays a week with the overlay's
    bound. Services fill n0, n1 and half of n2 (the fullest node first), four on n0 end at once: a 16-GPU gang
    needs n2 too, whose services can all start again at once on n0. Under the overlay it stops them after its
    1-h bound; under the Slurm config alone it waits for them to end. The overlay passed alone is refused,
    saying it is a part to name under `extends:`."""
    from typer.testing import CliRunner

    from drape.cli import app

    monkeypatch.delenv("DRAPE_SITE", raising=False)
    (tmp_path / "fleet.yaml").write_text(
        "groups:\n  - {model: H100, memory_gib: 80, nodes: 4, gpus_per_node: 8, node_prefix: n}\n"
    )
    rows = [f"s{i},{i},{50 if i < 4 else 40000},30,1,3,service" for i in range(20)] + ["wide,100,3600,70,16,5,stage-training"]
    (tmp_path / "t.csv").write_text("job_id,submit_s,duration_s,peak_mem_gib,gpus,priority,kind\n" + "\n".join(rows) + "\n")
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"extends": [str(REPO / "configs" / "slurm.yaml"), str(OVERLAY)], "name": "mine"}))
    args = ["queue", "simulate", "--trace", str(tmp_path / "t.csv"), "--fleet", str(tmp_path / "fleet.yaml"), "--policy", "drape"]
    ours = CliRunner().invoke(app, [*args, "--config", str(mine)])
    plain = CliRunner().invoke(app, [*args, "--config", str(REPO / "configs" / "slurm.yaml")])
    assert ours.exit_code == 0 and plain.exit_code == 0, ours.output + plain.output

    def gang_wait(out: str) -> str:
        return next(line for line in out.splitlines() if line.startswith("| drape | ") and "jobs)" in line).split("|")[5]

    assert "60.0 / 60.0 / 60.0 min (1 jobs)" in gang_wait(ours.stdout)  # the 1-h bound: n2's services moved to n0
    assert "(1 jobs)" in gang_wait(plain.stdout) and "60.0 / 60.0" not in gang_wait(plain.stdout)
    alone = CliRunner().invoke(app, [*args, "--config", str(OVERLAY)])
    said = " ".join(alone.output.split())
    assert alone.exit_code == 2 and "gang-waits.yaml: no train section in it or the files it extends" in said
    assert "runs only named under `extends:` after a whole config" in said
