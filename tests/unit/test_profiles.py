"""Memory profiles: estimated from the config, overridden by the measured p95 plus headroom."""

import pytest

from scheduler.jobs.profiles import estimate, parameter_counts, profile, shape_key
from scheduler.queue.store import JobSpec, JobStore


def test_estimate_grows_with_what_the_job_holds(config):
    counts = parameter_counts(config, "identity")
    assert counts[0] == counts[1] > 0  # identity trains every parameter
    training, _ = estimate(config, "stage-training", "identity", counts=counts)
    evaluation, _ = estimate(config, "gate-eval", "identity", counts=counts)
    assert training > evaluation > 1.5  # CUDA context alone is 1.5 GiB
    bigger = config.model_copy(update={"train": config.train.model_copy(update={"batch_size": 64})})
    assert estimate(bigger, "stage-training", "identity", counts=counts)[0] > training


def test_8bit_moments_accumulation_and_guidance_change_the_estimate(config):
    counts = parameter_counts(config, "identity")
    training, _ = estimate(config, "stage-training", "identity", counts=counts)
    evaluation, seconds = estimate(config, "gate-eval", "identity", counts=counts)

    def changed(section, **update):
        return config.model_copy(update={section: getattr(config, section).model_copy(update=update)})

    eight_bit = changed("train", optimizer="adamw8bit")
    assert estimate(eight_bit, "stage-training", "identity", counts=counts)[0] == pytest.approx(
        training - 6 * counts[1] / 2**30
    )  # 2 B of moments per trainable parameter instead of 8
    accumulated = changed("train", grad_accumulation_steps=4)
    assert estimate(accumulated, "stage-training", "identity", counts=counts)[0] < training
    guided = estimate(changed("diffusion", guidance_scale=3.0), "gate-eval", "identity", counts=counts)
    assert guided[0] > evaluation and guided[1] == pytest.approx(2 * seconds)
    assert shape_key(accumulated, "stage-training", "identity").split("/")[4] == "b16x4"
    assert "/adamw8bit/" in shape_key(eight_bit, "stage-training", "identity")
    assert shape_key(config, "stage-training", "identity").endswith("/b16/fp32/1gpu")  # unchanged by default


def test_measured_history_overrides_the_estimate_with_p95_plus_headroom(config, tmp_path):
    store = JobStore(f"sqlite:///{tmp_path}/queue.db")
    first = profile(config, store, "stage-training", "texture")
    assert first.source == "estimate" and first.mem_gib == first.estimate_gib and first.measured_p95_gib is None
    shape = shape_key(config, "stage-training", "texture")
    for peak in [2.0] * 18 + [3.0, 4.0]:
        job_id = store.submit(JobSpec(kind="stage-training", command=["true"], mem_gib=1, duration_s=10, shape=shape))
        from scheduler.policy import GpuState, Placement

        store.register_gpus([GpuState("n/gpu0", "n", "H100", 80.0)])
        assert store.claim(Placement(job_id, ("n/gpu0",), 1.0), "d", 60, 4)
        store.finish(job_id, exit_code=0, peak_gib=peak)
    learned = profile(config, store, "stage-training", "texture")
    assert learned.source == "measured" and learned.measurements == 20
    assert learned.measured_p95_gib == pytest.approx(3.0)
    assert learned.mem_gib == pytest.approx(3.0 * (1 + config.queue.headroom))
