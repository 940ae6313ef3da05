"""`drape queue submit` refuses at once, with why, a job no node of the fleet can ever hold or whose memory
is not a finite positive number; a queued job past the placement timeout fails with the reason."""

from __future__ import annotations

import math

import pytest
import yaml
from typer.testing import CliRunner

from drape.cli import app
from scheduler.dispatch.dispatcher import unplaceable
from scheduler.queue.store import JobSpec, JobStore, QueueError
from tests.conftest import tiny_config

FLEET = {"groups": [{"model": "H100-80GB", "memory_gib": 80, "nodes": 2, "gpus_per_node": 4, "node_prefix": "h100"}]}


@pytest.fixture
def config_path(tmp_path):
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(FLEET))
    config = tiny_config(tmp_path / "drape", queue={"fleet": "static", "inventory": str(tmp_path / "fleet.yaml")})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


def _submit(config_path, *flags):
    return CliRunner().invoke(app, ["queue", "submit", "--kind", "finetune", *flags, "--config", str(config_path), "--", "true"])


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--mem-gib", "40", "--gpus", "8"], "the largest node 4 GPU(s)"),  # more GPUs than any node has
        (["--mem-gib", "96"], "the largest GPU has 80.0 GiB"),  # more memory than any GPU
        (["--mem-gib", "60", "--gpus", "5"], "it needs 5 GPU(s) with 60.0 GiB each on one node"),
        (["--mem-gib", "10", "--gpu-model", "B200"], "no GPU of the fleet is one of the models it allows (B200)"),
    ],
)
def test_a_job_no_node_can_hold_is_refused_at_submit_with_why(config_path, flags, why):
    result = _submit(config_path, *flags)
    assert result.exit_code == 2, result.output
    assert "refused" in result.output and why in " ".join(result.output.split())
    listed = CliRunner().invoke(app, ["queue", "list", "--config", str(config_path)])
    assert "finetune" not in listed.output  # nothing was queued


def test_a_job_the_fleet_can_hold_is_queued(config_path):
    result = _submit(config_path, "--mem-gib", "70", "--gpus", "4", "--gpu-model", "H100")
    assert result.exit_code == 0, result.output
    listed = CliRunner().invoke(app, ["queue", "list", "--config", str(config_path)], env={"COLUMNS": "200"})
    assert result.output.strip() in listed.output and "queued" in listed.output


def test_a_job_declares_at_submit_whether_it_may_be_stopped(config_path):
    """`--no-preemptible` and `--checkpoint-every` reach the queued job as the policy reads it; a
    cadence out of bounds is refused."""
    from drape.config import load_config
    from scheduler.queue.store import JobStore

    result = _submit(config_path, "--mem-gib", "10", "--no-preemptible", "--checkpoint-every", "1800")
    assert result.exit_code == 0, result.output
    (queued,) = JobStore(load_config(config_path).queue_url).pending()
    assert not queued.preemptible and queued.checkpoint_every_s == 1800.0
    refused = _submit(config_path, "--mem-gib", "10", "--checkpoint-every", "0")
    assert refused.exit_code == 2 and "checkpoint_every_s" in refused.output


@pytest.mark.parametrize("priority", ["1000001", "-1000001", "99999999999"])
def test_a_priority_no_queue_row_holds_is_refused_naming_the_bound(config_path, priority, tmp_path):
    """The queue's priority column is a 32-bit integer on PostgreSQL: a priority out of bounds is
    refused with the bound (the flag, and the store for any other caller), not at the insert with
    the database's error; a negative one within it is a priority, not a size."""
    args = ["queue", "submit", "--kind", "finetune", "--mem-gib", "10", f"--priority={priority}", "--config", str(config_path)]
    refused = CliRunner().invoke(app, [*args, "--", "true"], env={"COLUMNS": "300"})
    said = " ".join(refused.output.split())
    bound = "greater than or equal to -1000000" if priority.startswith("-") else "less than or equal to 1000000"
    assert refused.exit_code == 2 and "--priority" in said and bound in said, said
    with pytest.raises(QueueError, match=r"priority must be an integer in \[-1000000, 1000000\]"):
        JobStore(f"sqlite:///{tmp_path}/q.db").submit(JobSpec("finetune", ["true"], 10.0, 60.0, priority=int(priority)))
    assert _submit(config_path, "--mem-gib", "10", "--priority=1000000").exit_code == 0
    assert _submit(config_path, "--mem-gib", "10", "--priority=-5").exit_code == 0


# --- memory that is not a number; jobs no node can hold, or that wait past the placement timeout ---
@pytest.mark.parametrize("mem", [math.nan, math.inf, -1.0, 0.0])
def test_queue_refuses_memory_that_is_not_a_finite_positive_number(tmp_path, mem):
    store = JobStore(f"sqlite:///{tmp_path}/q.db")
    with pytest.raises(QueueError, match="finite mem_gib"):
        store.submit(JobSpec(kind="stage-training", command=["true"], gpus=1, mem_gib=mem, duration_s=60.0))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"gpus": 100_000}, r"gpus <= 1024 and mem_gib <= 4096 \(per GPU\), got 100000"),
        ({"mem_gib": 1e9}, r"gpus <= 1024 and mem_gib <= 4096"),
        ({"duration_s": 1e12}, r"duration_s must be a finite number in \[0, 3.16224e\+08\] \(ten years\), got 1000000000000.0"),
    ],
    ids=["a typo's GPUs", "a typo's memory", "a century"],
)
def test_the_queue_refuses_a_job_no_fleet_or_week_could_hold_whatever_fleet_it_knows(tmp_path, change, match):
    """The fleet check at submit needs a known fleet; the store's bounds hold without one (the
    simulator's trace has the same ones)."""
    store = JobStore(f"sqlite:///{tmp_path}/q.db")
    spec = {"kind": "stage-training", "command": ["true"], "gpus": 1, "mem_gib": 10.0, "duration_s": 60.0, **change}
    with pytest.raises(QueueError, match=match):
        store.submit(JobSpec(**spec))
    assert store.jobs() == []


def test_a_job_no_node_can_hold_is_refused_with_what_to_do(tmp_path):
    from scheduler.dispatch.dispatcher import submit_and_wait

    config = tiny_config(tmp_path, queue={"enabled": True, "cpu_slot_gib": 16.0})
    with pytest.raises(QueueError, match="no node of the fleet can hold it.*Lower the job's memory"):
        submit_and_wait(
            config, JobSpec(kind="stage-training", command=["true"], gpus=1, mem_gib=500.0, duration_s=60.0), timeout_s=5
        )
    assert JobStore(config.queue_url).jobs() == []
    assert unplaceable(1, 8.0, [_gpu("n1", 16.0)]) is None
    assert "2 GPU(s)" in unplaceable(2, 8.0, [_gpu("n1", 16.0), _gpu("n2", 16.0)])


def test_a_queued_job_past_the_placement_timeout_fails_with_the_reason(tmp_path):
    from scheduler.dispatch.dispatcher import Dispatcher
    from scheduler.dispatch.fleet import FleetView

    config = tiny_config(tmp_path, queue={"enabled": True, "placement_timeout_seconds": 60})
    store = JobStore(config.queue_url)
    busy = _gpu("n1", 16.0)
    busy.allocated_gib, busy.jobs = 16.0, 4
    job = store.submit(JobSpec(kind="stage-training", command=["true"], gpus=1, mem_gib=8.0, duration_s=60.0), now=0.0)
    Dispatcher(config, store, fleet=lambda: FleetView([busy], "local", "")).cycle(now=30.0)
    assert store.get(job)["state"] == "queued"
    Dispatcher(config, store, fleet=lambda: FleetView([busy], "local", "")).cycle(now=90.0)
    assert store.get(job)["state"] == "failed" and "placement_timeout_seconds" in store.get(job)["message"]


def _gpu(node: str, total: float):
    from scheduler.policy import GpuState

    return GpuState(uuid=f"{node}-gpu0", node=node, model="H100-80GB", total_gib=total)
