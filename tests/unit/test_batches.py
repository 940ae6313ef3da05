"""drape.training.loop.batches: worker processes decode what a thread decodes; they fail fast, never hang."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest
import torch

from drape.config import LoaderConfig
from drape.data.partition import StageData, split_data
from drape.data.reader import ShardIndex
from drape.data.shards import MODEL_FIELDS
from drape.training.loop.batches import BatchError, BatchPrefetcher
from tests.unit.test_reader import _corrupt_member


@pytest.fixture(scope="module")
def texture(tiny_dataset):
    directory, manifest, _ = tiny_dataset
    return split_data(directory, manifest, "texture")


def _prefetcher(data, *, stop=6, **loader):
    config = LoaderConfig(**{"workers": 2, "prefetch_batches": 2, **loader})
    return BatchPrefetcher(data, range(1), seed=5, stage="texture", batch_size=4, start=0, stop=stop, loader=config)


def _all(prefetcher, steps):
    try:
        return [prefetcher.next()[0] for _ in range(steps)]
    finally:
        prefetcher.close()


def test_workers_decode_the_batches_a_thread_decodes_in_step_order(texture):
    threaded, workers = _all(_prefetcher(texture, workers=0), 6), _all(_prefetcher(texture, workers=2), 6)
    assert [step for step, _, _ in workers] == list(range(6))
    for (_, a, gen_a), (_, b, gen_b) in zip(threaded, workers):
        assert set(b) == set(MODEL_FIELDS) and b["target"].dtype == torch.uint8 and b["target"].shape[0] == 4
        for name in MODEL_FIELDS:
            assert torch.equal(a[name], b[name]), name
        assert torch.equal(torch.randn(3, generator=gen_a), torch.randn(3, generator=gen_b))  # the step's draws go on


def test_an_undecodable_sample_names_the_shard_member_and_step(texture, tmp_path):
    broken = tmp_path / "broken.tar"
    name = _corrupt_member(texture.partitions[0].paths[0], broken, ".pose.png")
    data = StageData({0: ShardIndex([broken])}, [len(ShardIndex([broken]))])
    prefetcher = _prefetcher(data, stop=200)
    with pytest.raises(BatchError, match=rf"stage texture, step \d+: shard {broken}: member '{name}' cannot be decoded"):
        _all(prefetcher, 200)


class _TwoSamples:
    """A partition of two samples, 'a' and 'b', that needs no prefetching; subclasses say how they read."""

    keys = ["a", "b"]
    model_fields = MODEL_FIELDS

    def __len__(self) -> int:
        return 2

    def prefetch(self, indices, fields=()):
        pass


class _Resized(_TwoSamples):
    """A partition whose second sample has another resolution than its first."""

    def sample(self, index, fields=()):
        side = 8 if index == 0 else 16
        return {"key": self.keys[index]} | {name: np.zeros((side, side, 3), np.uint8) for name in fields}


def test_a_sample_of_another_resolution_is_named_not_broadcast():
    with pytest.raises(
        BatchError, match=r"stage texture, step \d+: sample '[ab]' of partition 0: target is \(\d+, \d+, 3\), the batch's first"
    ):
        _all(_prefetcher(StageData({0: _Resized()}, [2]), stop=50), 50)


def test_batches_are_decoded_into_handoff_files_that_leave_nothing_behind(texture, tmp_path):
    prefetcher = _prefetcher(texture, stop=8, handoff_dir=str(tmp_path))
    (directory,) = tmp_path.iterdir()
    batches = [prefetcher.next()[0][1] for _ in range(8)]
    assert list(directory.iterdir()) == []  # every step handed over: each file unlinked once mapped
    assert all(batch["target"].shape[0] == 4 for batch in batches)
    batches[0]["target"][0] += 1  # a handed-over batch is the trainer's to write (copy-on-write)
    prefetcher.close()
    assert not directory.exists()


def _new_children(before: set) -> list:
    return [p for p in multiprocessing.active_children() if p.pid not in before]


def test_a_worker_that_dies_is_an_error_within_seconds(texture):
    before = {p.pid for p in multiprocessing.active_children()}
    prefetcher = _prefetcher(texture, stop=10_000)
    prefetcher.next()
    workers = _new_children(before)
    assert len(workers) == 2
    os.kill(workers[0].pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(
        BatchError, match=rf"stage texture, step \d+: decoding worker decode-\d \(pid {workers[0].pid}\) was killed by SIGKILL"
    ):
        _all(prefetcher, 10_000)
    assert time.monotonic() - started < 5


class _Stuck(_TwoSamples):
    """A partition whose reads never return (a hung network filesystem)."""

    def sample(self, index, fields=()):
        time.sleep(3600)


def test_a_read_that_never_returns_is_an_error_after_the_timeout():
    before = {p.pid for p in multiprocessing.active_children()}
    prefetcher = _prefetcher(StageData({0: _Stuck()}, [2]), timeout_seconds=0.5)
    started = time.monotonic()
    with pytest.raises(
        BatchError, match=r"stage texture, step 0: no batch after 0.5 s \(data.loader.timeout_seconds\): is a read stuck"
    ):
        prefetcher.next()
    assert time.monotonic() - started < 10
    workers = _new_children(before)
    assert len(workers) == 2
    prefetcher.close()  # the workers stuck in the read are stopped
    assert not any(worker.is_alive() for worker in workers)


def test_closing_early_stops_the_workers(texture):
    before = {p.pid for p in multiprocessing.active_children()}
    prefetcher = _prefetcher(texture, stop=10_000)
    prefetcher.next()
    workers = _new_children(before)
    assert len(workers) == 2
    prefetcher.close()
    for worker in workers:
        worker.join(timeout=15)
    assert not any(worker.is_alive() for worker in workers)
