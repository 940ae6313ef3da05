"""Trainer: only the stage's parameters move; a killed run resumes to the same weights."""

import pytest
import torch

from drape.training.checkpoints.checkpoint import load_model
from drape.training.loop.trainer import train_stage
from tests.unit.conftest import seven_texture_steps, uninterrupted_and_resumed


def test_resume_after_kill_matches_uninterrupted(config, texture_data, tmp_path):
    cfg = seven_texture_steps(config, ema={"enabled": True, "decay": 0.9})
    full, resumed = uninterrupted_and_resumed(cfg, texture_data, tmp_path)
    assert resumed.resumed_from_step == 3 and resumed.steps == 7
    a, b = load_model(full.checkpoint).state_dict(), load_model(resumed.checkpoint).state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert resumed.final_loss == full.final_loss


def test_only_the_stage_subset_trains(config, texture_data, tmp_path):
    cfg = seven_texture_steps(config)
    first = train_stage(cfg, stage="texture", data=texture_data, out_dir=tmp_path / "a", init_checkpoint=None)
    before = load_model(first.checkpoint).state_dict()
    data = cfg.model_dump(mode="json")
    data["train"]["stages"]["denoise"] = {"steps": 3, "trainable": ["transformer.proj_out.*"]}
    second = train_stage(
        type(cfg).model_validate(data),
        stage="denoise",
        data=texture_data,
        out_dir=tmp_path / "b",
        init_checkpoint=first.checkpoint,
    )
    after = load_model(second.checkpoint).state_dict()
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed == {"transformer.proj_out.weight", "transformer.proj_out.bias"}


def test_metrics_reach_the_sink_and_prometheus(config, texture_data, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from drape.ops.metrics import exposition

    logged = []
    result = train_stage(
        seven_texture_steps(config, log_every=2),
        stage="texture",
        data=texture_data,
        out_dir=tmp_path,
        init_checkpoint=None,
        log_metrics=lambda m, step: logged.append((step, m)),
        metric_labels={"run": "run-metrics-test"},
    )
    labels = {"run": "run-metrics-test", "stage": "texture"}
    samples = {
        s.name: s
        for family in text_string_to_metric_families(exposition(labels))
        for s in family.samples
        if s.labels.get("le") is None
    }
    assert samples["drape_data_wait_seconds_count"].labels == {**labels, "rank": "0"}
    assert samples["drape_data_wait_seconds_count"].value == 7 and samples["drape_train_step_seconds_count"].value == 7
    assert abs(samples["drape_data_wait_seconds_sum"].value - result.data_wait_seconds) < 1e-6
    assert [step for step, _ in logged] == [2, 4, 6, 7, 7]  # the last: per-rank data-wait
    assert {"texture/loss", "texture/data_wait_seconds", "texture/samples_per_second"} <= set(logged[0][1])
    assert logged[-1] == (7, {"texture/data_wait_fraction/rank0": result.ranks[0]["data_wait_fraction"]})
    assert result.ranks[0]["rank"] == 0 and result.ranks[0]["samples"] == sum(texture_data.sizes)
    assert 0 <= result.data_wait_fraction < 1 and result.samples_per_second > 0


def test_patterns_that_match_nothing_fail_clearly(config, texture_data, tmp_path):
    data = config.model_dump(mode="json")
    data["train"]["stages"]["texture"]["trainable"] = ["no.such.layer*"]
    with pytest.raises(
        ValueError, match=r"trainable patterns \['no.such.layer\*'\] match no trainable parameter of TryOnTransformer"
    ):
        train_stage(type(config).model_validate(data), stage="texture", data=texture_data, out_dir=tmp_path, init_checkpoint=None)


def test_gradient_checkpointing_gives_the_same_weights(config, texture_data, tmp_path):
    plain = train_stage(
        seven_texture_steps(config), stage="texture", data=texture_data, out_dir=tmp_path / "plain", init_checkpoint=None
    )
    checkpointed = train_stage(
        seven_texture_steps(config, gradient_checkpointing=True),
        stage="texture",
        data=texture_data,
        out_dir=tmp_path / "ckpt",
        init_checkpoint=None,
    )
    a, b = load_model(plain.checkpoint).state_dict(), load_model(checkpointed.checkpoint).state_dict()
    assert max(float((a[n] - b[n]).abs().max()) for n in a) < 1e-5
