"""The cost account: every GPU-second of a run in exactly one category, priced by model and plan;
idle fleet capacity; scaling efficiency; a modelled run."""

from __future__ import annotations

import pytest

from drape.config.cost import CostConfig, GpuPrice
from drape.cost import CostError, gpu_rate
from drape.cost.account import CATEGORIES, Attempt, build, measure, subtract, union
from drape.cost.fleet import idle_cost
from drape.cost.report import modelled
from drape.cost.scaling import efficiency


def _step(stage, step, start, end, **extra):
    return {"event": "step", "stage": stage, "step": step, "start": start, "end": end, **extra}


def _train(stage, loop_start, seconds, wait=0.0, stall=0.0, world=1, window=None):
    return {
        "event": "train",
        "stage": stage,
        "loop_started_at": loop_start,
        "train_seconds": seconds,
        "world_size": world,
        "data_wait_gpu_seconds": wait,
        "checkpoint_stall_seconds": stall,
        "device": "NVIDIA H100 80GB HBM3",
        "window": window,
    }


def test_intervals():
    assert union([(0, 2), (1, 3), (5, 6), (6, 7)]) == [(0, 3), (5, 7)]
    assert subtract([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]
    assert measure([(0, 2), (1, 3)]) == 3


def test_every_gpu_second_lands_in_one_category():
    """Two segments (killed at 95, resumed at 200), a job killed mid-run and requeued, a smaller
    job beside the 2-GPU ones, gates between: the hand-worked split, adding up to the holding."""
    events = [
        {"event": "open", "at": 0.0},
        _step("identity", "prestage", 1, 4),
        _train("identity", 20, 50, wait=6, stall=2, world=2),  # job A: claim 10, loop 20-70, release 75
        _step("identity", "gate", 76, 80),
        _step("identity", "snapshot", 80, 82),
        _step("identity", "archive", 82, 85, live_bytes_before=10**9),
        _step("texture", "prestage", 40, 60),  # concurrent with training: not GPU time
        # killed at 95 while texture's first attempt (claim 90) ran; resumed at 200
        {"event": "open", "at": 200.0},
        _train("texture", 215, 30, world=1),  # job B, second attempt: claim 210, loop 215-245, release 250
        _step("texture", "gate", 255, 260),
        _step("texture", "archive", 262, 265),
        {"event": "close", "status": "FINISHED", "at": 270.0},
    ]
    attempts = [
        Attempt("a", "identity", 2, "NVIDIA H100 80GB HBM3", 10, 75),
        Attempt("b", "texture", 1, "NVIDIA H100 80GB HBM3", 90, 95),  # killed with the flow
        Attempt("b", "texture", 1, "NVIDIA H100 80GB HBM3", 210, 250),
    ]
    account = build(events, attempts, now=1000)
    assert account.gpus == 2
    assert account.segments == [(0.0, 95.0), (200.0, 270.0)]
    seconds = account.by_category()
    expected = {
        "training": 2 * 50 - 6 - 2 * 2 + 30,
        "data wait": 6,
        "checkpoint stall": 4,
        "start-up": 2 * 10 + 5,
        "shutdown": 2 * 5 + 5,
        "failed attempts": 5,
        "unused GPUs": 5 + 40,  # texture's 1-GPU job on the run's 2
        "gate sampling": 2 * (4 + 5),
        "between stages": 2 * ((10 - 0) + (76 - 75) + (90 - 80) + (210 - 200) + (255 - 250) + (270 - 260)),
    }
    assert seconds == pytest.approx(expected)
    assert sum(seconds.values()) == pytest.approx(account.allocated_gpu_seconds) == pytest.approx(2 * 165)
    assert account.windows == {"identity": (0.0, 85.0), "texture": (85.0, 270.0)}
    assert set(seconds) == set(CATEGORIES)


def test_an_in_process_job_is_its_own_window_and_a_killed_segment_ends_at_its_last_record():
    events = [
        {"event": "open", "at": 0.0},
        _train("identity", 3, 5, wait=1, window=(1, 9)),
        _step("identity", "gate", 9, 12),
    ]
    account = build(events, [], now=500)
    assert account.segments == [(0.0, 12.0)]  # never closed: up to the gate's end, not `now`
    seconds = account.by_category()
    assert seconds["start-up"] == 2 and seconds["training"] == 4 and seconds["data wait"] == 1 and seconds["shutdown"] == 1
    assert seconds["gate sampling"] == 3 and seconds["between stages"] == 1
    assert account.models == {"identity": "NVIDIA H100 80GB HBM3"}


def test_gpu_prices_match_a_part_of_the_model_name_and_an_unpriced_model_is_named():
    cost = CostConfig(
        gpu_prices={
            "H100": GpuPrice(on_demand=2.49, reserved=1.89, burst=2.69),
            "H100 NVL": GpuPrice(on_demand=3, reserved=2, burst=4),
        }
    )
    assert gpu_rate(cost, "NVIDIA H100 80GB HBM3", "on-demand") == 2.49
    assert gpu_rate(cost, "NVIDIA H100 NVL", "burst") == 4  # the longest key wins
    with pytest.raises(CostError, match=r"'NVIDIA A100-SXM4-40GB' has no price: add it to cost.gpu_prices"):
        gpu_rate(cost, "NVIDIA A100-SXM4-40GB", "reserved")
    a10 = CostConfig(gpu_prices={"A10": GpuPrice(on_demand=1.0, reserved=0.8, burst=1.2)})
    assert gpu_rate(a10, "NVIDIA A10G", "on-demand") == 1.0
    with pytest.raises(CostError, match=r"'NVIDIA A100-SXM4-80GB' has no price"):  # not an A10's price: a part that cuts 100
        gpu_rate(a10, "NVIDIA A100-SXM4-80GB", "on-demand")


def test_idle_fleet_hours_are_the_window_less_the_union_of_claims():
    cost = CostConfig()
    inventory = [("g0", "NVIDIA H100 80GB HBM3"), ("g1", "NVIDIA H100 80GB HBM3")]
    log = [
        {"job_id": "j1", "gpu_uuid": "g0", "event": "claim", "at_s": 0.0},
        {"job_id": "j2", "gpu_uuid": "g0", "event": "claim", "at_s": 1800.0},  # shared: counted once
        {"job_id": "j1", "gpu_uuid": "g0", "event": "release", "at_s": 3600.0},
        {"job_id": "j2", "gpu_uuid": "g0", "event": "release", "at_s": 5400.0},
        {"job_id": "j3", "gpu_uuid": "g1", "event": "claim", "at_s": 6000.0},  # still running at the end
    ]
    fleet = idle_cost(cost, inventory, log, start=0.0, end=7200.0)
    (row,) = fleet["models"]
    assert row["allocated_gpu_hours"] == pytest.approx(1.5 + 1200 / 3600)
    assert fleet["idle_gpu_hours"] == pytest.approx(4 - row["allocated_gpu_hours"])
    assert fleet["idle_usd"] == pytest.approx(fleet["idle_gpu_hours"] * 1.89)  # the fleet's plan: reserved


def test_scaling_efficiency_and_a_modelled_run():
    assert efficiency({1: 100.0, 2: 180.0, 4: 300.0}) == {1: 1.0, 2: 0.9, 4: 0.75}
    with pytest.raises(ValueError, match="1-rank"):
        efficiency({2: 10.0})
    overheads = {"loop_shares": {"data wait": 0.1, "checkpoint stall": 0.1}, "seconds_per_stage": {"start-up": 90.0}}
    run = modelled(CostConfig(), {"identity": 10.0, "texture": 10.0}, 8, "NVIDIA H100 80GB HBM3", overheads)
    assert run["rows"]["training"] == 160 and run["rows"]["data wait"] == pytest.approx(20)  # 10% of a 200 GPU-h loop
    assert run["rows"]["start-up"] == pytest.approx(2 * 90 * 8 / 3600)  # per stage job, on every GPU
    assert run["allocated_gpu_hours"] == pytest.approx(200 + 0.4)
    assert run["usd"]["on-demand"] == pytest.approx(200.4 * 2.49) and run["usd"]["burst"] == pytest.approx(200.4 * 2.69)


def test_the_what_if_lines_scale_training_by_measured_efficiency(tmp_path):
    import json

    from drape.cost.account import GpuAccount
    from drape.cost.report import what_if
    from drape.cost.scaling import scaling_key
    from drape.storage.store import ObjectStore
    from tests.conftest import tiny_config

    config = tiny_config(tmp_path / "drape")
    store = ObjectStore(f"file://{tmp_path}/objects")
    account = GpuAccount(1, [(0, 7200)], [(0, 7200)], models={"identity": "cpu"})
    gpu = {"rows": [{"category": "training", "gpu_hours": 2.0, "usd": 0.08}]}
    assert what_if(config, store, gpu, account, "on-demand") == []  # nothing measured: no line, no assumption
    record = {"efficiency": {"1": 1.0, "2": 0.8}, "device": "cpu"}
    store.put_bytes(json.dumps(record).encode(), scaling_key(config))
    one, two = what_if(config, store, gpu, account, "on-demand")
    assert (one["gpus"], one["training_gpu_hours"], one["training_wall_hours"]) == (1, 2.0, 2.0)
    assert two["training_gpu_hours"] == pytest.approx(2.5) and two["training_wall_hours"] == pytest.approx(1.25)
    assert two["usd"] == pytest.approx(2.5 * 0.04)
