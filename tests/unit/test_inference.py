"""The inference stick's parts: variants and what a CPU cannot run, the quality verdict, the report's
arithmetic (speed-ups against the reference's requests in a variant's turns, overlap, the
recommendation), the stick on a tiny model, and inputs of another size refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drape.config import ConfigError, QualityConfig, VariantSpec
from drape.inference import quality as q
from drape.inference import stick
from drape.inference.report import BenchReport, overlap, variant_row
from drape.inference.variants import prepare, reference_spec, resolved, unavailable
from drape.training.recipes.model import build_model
from tests.conftest import tiny_config

CPU = torch.device("cpu")


def test_reference_and_what_a_cpu_cannot_run(monkeypatch):
    reference = reference_spec(CPU)
    assert reference.precision == "fp32"
    assert resolved(VariantSpec(name="x", sdpa="math"), reference).precision == "fp32"
    assert resolved(VariantSpec(name="x", precision="bf16"), reference).precision == "bf16"
    assert VariantSpec(name="x", steps_fraction=0.5).sampling_steps(10) == 5
    assert VariantSpec(name="x", steps=3).sampling_steps(10) == 3
    reasons = {
        name: unavailable(resolved(VariantSpec(name=name, **fields), reference), CPU)
        for name, fields in {
            "graphs": {"compile": "reduce-overhead"},
            "fp8": {"fp8": True},
            "cudnn": {"sdpa": "cudnn"},
            "flash": {"sdpa": "flash"},
            "bf16": {"precision": "bf16"},
        }.items()
    }
    assert "CUDA graphs" in reasons["graphs"] and "compute capability 8.9" in reasons["fp8"]
    assert reasons["cudnn"].startswith("SDPA backend cudnn has no float32 kernel on cpu")
    assert reasons["flash"] is None and reasons["bf16"] is None
    monkeypatch.setattr("shutil.which", lambda _: None)
    assert "C++ compiler" in unavailable(VariantSpec(name="c", precision="fp32", compile="default"), CPU)


def test_variant_names_are_checked(tmp_path):
    for variants, concurrency, message in (
        ([{"name": "reference"}], [2], "not 'reference'"),
        ([{"name": "a"}, {"name": "a"}], [2], "must be unique"),
        ([{"name": "a"}], [1], "2 or more concurrent requests"),
    ):
        with pytest.raises(ConfigError, match=message):
            tiny_config(tmp_path, inference={"variants": variants, "concurrency": concurrency})
    with pytest.raises(ConfigError, match="runs"):
        tiny_config(tmp_path, inference={"runs": 5})  # the stick's median and p90 need at least 10


def test_attention_cosines_and_the_verdict():
    torch.manual_seed(0)
    reference = {"block.a/0": torch.randn(64), "block.a/1": torch.randn(64), "block.b/0": torch.randn(64)}
    same = {k: v.clone() for k, v in reference.items()}
    assert q.attention_cosines(reference, same) == pytest.approx({"block.a": 1.0, "block.b": 1.0})
    moved = {**same, "block.a/1": reference["block.a/1"] + 0.3 * torch.randn(64)}
    cosines = q.attention_cosines(reference, moved)
    assert cosines["block.a"] < 0.99 and cosines["block.b"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no attention output for"):
        q.attention_cosines(reference, {"block.a/0": reference["block.a/0"]})

    floor = q.Quality(attention_min=0.99999, checks={"identity": 0.998, "coherence": 0.97})
    limits = q.thresholds(floor, QualityConfig(attention_cosine_tolerance=1e-4, check_tolerance=0.01))
    assert limits.attention_min == pytest.approx(0.99989) and limits.checks["coherence"] == pytest.approx(0.96)
    assert q.verdict(q.Quality(attention_min=0.99995, checks={"identity": 0.99, "coherence": 0.965}), limits) == []
    reasons = q.verdict(q.Quality(attention_min=0.9990, checks={"identity": 0.99, "coherence": 0.90}), limits)
    assert reasons == ["attention cosine 0.999000 < 0.999890", "coherence 0.9000 < 0.9600"]


def _result(role: str, denoise: float, **extra) -> dict:
    base = {"role": role, "status": "measured", "describe": role, "steps": 10, "spec": {"name": role}}
    timings = {"denoise_s": [denoise] * 10, "total_s": [denoise * 1.2] * 10}
    return {**base, **timings, "peak_bytes": [1000, 1000], "together_s": {"2": 2 * denoise * 1.2 * 0.75}, **extra}


def _report(rows: list[dict]) -> BenchReport:
    limits = {"attention_min": 0.9999, "checks": {"identity": 0.99}}
    return BenchReport("b", "m", None, "c", "h", "cs", 2, {"seed": 1, "warmup": 1, "runs": 10}, {}, "control", {}, limits, rows)


def test_speed_ups_are_taken_in_turns_and_the_fastest_approved_variant_is_recommended():
    reference = _result("reference", 0.100)
    # the machine ran at half speed during this variant's turns: its reference requests took 0.2 s
    in_turns = {"denoise_s": [0.200] * 10, "total_s": [0.240] * 10}
    fast = variant_row("fast", _result("variant", 0.100, paired_reference=in_turns), reference, q.Quality(1.0), [])
    assert fast["speedup"] == pytest.approx(2.0) and fast["paired"] is True
    assert fast["overlap"] == {"2": pytest.approx(0.25)} and fast["approved"] is True
    faster_but_worse = variant_row("worse", _result("variant", 0.020), reference, q.Quality(0.9), ["attention cosine"])
    assert faster_but_worse["speedup"] == pytest.approx(5.0) and faster_but_worse["approved"] is False
    repeat = variant_row("reference-repeat", _result("repeat", 0.104), reference, None, [])
    skipped = variant_row("fp8", {"role": "variant", "status": "skipped", "reason": "needs CUDA"}, reference, None, [])
    report = _report(
        [variant_row("reference", reference, reference, q.Quality(1.0), []), repeat, fast, faster_but_worse, skipped]
    )
    assert report.recommended()["name"] == "fast"
    assert report.repeatability() == pytest.approx(1 - 0.100 / 0.104)
    assert skipped["approved"] is False and "fp8: skipped: needs CUDA" in report.markdown()


def test_a_reference_whose_requests_grew_no_memory_has_no_peak_ratio_and_the_table_still_prints():
    """On the CPU a tiny model's request can grow the resident set by nothing (its tensors fit the
    heap it already held): the suite once failed with ZeroDivisionError in `drape bench inference`."""
    reference = _result("reference", 0.100, peak_bytes=[0, 0, 0])
    variant = variant_row("bf16", _result("variant", 0.050), reference, q.Quality(1.0), [])
    assert variant["peak_ratio"] is None and variant["peak_bytes"] == 1000 and variant["speedup"] == pytest.approx(2.0)
    row = variant_row("reference", reference, reference, q.Quality(1.0), [])
    assert row["peak_ratio"] is None and row["peak_bytes"] == 0
    assert "bf16" in _report([row, variant]).markdown()
    measured = variant_row("bf16", _result("variant", 0.050, peak_bytes=[500]), _result("reference", 0.1), None, [])
    assert measured["peak_ratio"] == pytest.approx(0.5)


@pytest.fixture(scope="module")
def prepared_tiny(tmp_path_factory):
    config = tiny_config(tmp_path_factory.mktemp("stick"))
    return config, prepare(build_model(config), reference_spec(CPU), CPU, config.diffusion.sampling_steps)


def test_the_stick_times_one_request_at_a_time(prepared_tiny, tiny_dataset):
    from drape.data.dataset import load_split, to_model_inputs

    config, prepared = prepared_tiny
    directory, manifest, _ = tiny_dataset
    inputs = to_model_inputs(load_split(directory, manifest, "control"))
    requests = [{k: v[i : i + 1] for k, v in inputs.items()} for i in range(3)]
    session = stick.Session(prepared, config.diffusion, requests, 5)
    session.warm(1)
    session.timed(10)
    measured = {**session.timings, "outputs": session.outputs()}
    assert len(measured["denoise_s"]) == len(measured["total_s"]) == 10
    assert all(0 < d < t for d, t in zip(measured["denoise_s"], measured["total_s"]))
    assert measured["outputs"].shape == (3, 32, 32, 3) and measured["outputs"].dtype == np.uint8
    again = stick.request(prepared, config.diffusion, requests[1], 5)[0]
    assert np.array_equal(again, measured["outputs"][1])  # fixed seed: the same request renders the same pixels
    attention = stick.attention_outputs(prepared, config.diffusion, requests[:2], 5, 0.5)
    assert sorted(attention) == ["transformer.transformer_blocks.0.attn/0", "transformer.transformer_blocks.0.attn/1"]
    assert stick.concurrency(prepared, config.diffusion, requests, [2], 1, 5)[2] > 0
    assert overlap(1.0, 1.5, 2) == pytest.approx(0.25)


@pytest.mark.parametrize(("height", "width"), [(64, 64), (32, 64), (16, 32)])
def test_inputs_of_another_size_are_refused_naming_sample_size_and_expected(tmp_path, height, width):
    from drape.inference.source import InferenceInputError, check_input_sizes

    arrays = {"target": np.zeros((2, height, width, 3), np.uint8), "keys": ["person-7", "person-8"], "meta": [{}, {}]}
    with pytest.raises(InferenceInputError, match=rf"inputs: sample person-7: its target image is {width}×{height}.*32×32"):
        check_input_sizes(arrays, "--inputs inputs", 32, 32)
    check_input_sizes({**arrays, "target": np.zeros((2, 32, 32, 3), np.uint8)}, "--inputs inputs", 32, 32)
