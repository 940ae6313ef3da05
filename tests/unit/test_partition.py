"""A stage's shards dealt to ranks without overlap; the global batch does not depend on the world size;
an empty or too small split, and a partition without samples, are refused by name and number."""

import pytest
import torch

from drape.data.cache import ShardCache
from drape.data.dataset import publish_dataset
from drape.data.partition import (
    PartitionError,
    load_stage_data,
    partition_shards,
    rank_partitions,
    resolve_partitions,
    split_data,
)
from drape.storage.store import ObjectStore
from drape.training.loop.batches import BatchPrefetcher

PREFIX = "datasets/synth-tryon/v1"


@pytest.fixture
def cache_factory(tiny_dataset, tmp_path):
    directory, manifest, _ = tiny_dataset
    store = ObjectStore(f"file://{tmp_path / 'objects'}")
    publish_dataset(directory, store, PREFIX)
    return lambda name: ShardCache(tmp_path / name, store, PREFIX, manifest, budget_bytes=1 << 30)


def test_partitions_are_disjoint_cover_the_stage_and_are_checked():
    shards = [{"path": f"s{i}", "samples": 10} for i in range(5)]
    dealt = partition_shards(shards, 2)
    assert [[s["path"] for s in group] for group in dealt] == [["s0", "s2", "s4"], ["s1", "s3"]]
    assert list(rank_partitions(4, 2, 1)) == [2, 3] and list(rank_partitions(2, 2, 0)) == [0]
    assert resolve_partitions(None, 4, 16) == 4 and resolve_partitions(8, 2, 16) == 8
    with pytest.raises(PartitionError, match="multiple of the world size 4"):
        resolve_partitions(2, 4, 16)
    with pytest.raises(PartitionError, match="batch_size=12 .* divisible by the 8"):
        resolve_partitions(8, 2, 12)
    with pytest.raises(PartitionError, match="stage 'texture' has 5 shard\\(s\\), fewer than the 8"):
        partition_shards(shards, 8, what="stage 'texture'")


def test_each_rank_reads_only_its_own_shards(cache_factory, tiny_dataset):
    _, manifest, _ = tiny_dataset
    stage_shards = manifest["splits"]["identity"]
    assert len(stage_shards) >= 2
    held = {}
    for rank in range(2):
        cache = cache_factory(f"node-{rank}")  # one node-local cache per rank: what each fetched is all it read
        data = load_stage_data(cache, "identity", partitions=2, world_size=2, rank=rank)
        held[rank] = data
        fetched = {p.name for p in (cache.dataset_dir / "identity").glob("*.tar")}
        assert fetched == {s["path"].split("/")[-1] for s in stage_shards[rank::2]}
        assert set(data.partitions) == {rank}
    keys = [set(held[r].partitions[r].keys) for r in range(2)]
    assert not keys[0] & keys[1]
    assert len(keys[0] | keys[1]) == sum(s["samples"] for s in stage_shards) == sum(held[0].sizes)


def test_the_global_batch_is_the_same_on_one_and_two_ranks(cache_factory):
    whole = load_stage_data(cache_factory("one"), "identity", partitions=2, world_size=1, rank=0)
    halves = [load_stage_data(cache_factory("two"), "identity", partitions=2, world_size=2, rank=r) for r in range(2)]
    one = BatchPrefetcher(whole, range(0, 2), seed=3, stage="identity", batch_size=8, start=0, stop=4)
    two = [BatchPrefetcher(halves[r], range(r, r + 1), seed=3, stage="identity", batch_size=8, start=0, stop=4) for r in range(2)]
    seen = []
    for _ in range(4):
        (step, batch, _), _ = one.next()
        seen.append(batch["target"])
        parts = [prefetcher.next()[0] for prefetcher in two]
        assert all(part[0] == step for part in parts)
        for name in batch:
            assert torch.equal(batch[name], torch.cat([part[1][name] for part in parts])), name
    assert not torch.equal(seen[0], seen[1])  # a fresh draw every step


def test_a_rank_without_its_partition_is_refused(cache_factory):
    data = load_stage_data(cache_factory("c"), "identity", partitions=2, world_size=2, rank=0)
    with pytest.raises(PartitionError, match=r"needs data partitions \[1\] but holds \[0\]"):
        BatchPrefetcher(data, range(1, 2), seed=0, stage="identity", batch_size=8, start=0, stop=1)


def test_a_split_on_disk_is_dealt_as_a_stage_is(tiny_dataset, cache_factory):
    directory, manifest, _ = tiny_dataset
    whole = split_data(directory, manifest, "identity", partitions=2)
    staged = load_stage_data(cache_factory("s"), "identity", partitions=2, world_size=1, rank=0)
    assert whole.sizes == staged.sizes and whole.shards == staged.shards
    for p in range(2):
        assert whole.partitions[p].keys == staged.partitions[p].keys


# --- degenerate splits and partitions -------------------------------------------------------------
def _with_split(manifest: dict, split: str, shards: list[dict]) -> dict:
    return {**manifest, "splits": {**manifest["splits"], split: shards}}


@pytest.mark.parametrize(
    ("split", "shards", "match"),
    [
        ("control", [], r"'control'.* 0 sample\(s\) in 0 shard.*at least 2"),
        ("control", "one", r"'control'.* 1 sample\(s\).*at least 2"),
        ("identity", [], r"'identity'.* 0 sample\(s\).*at least 1"),
        ("identity", "empty", r"'identity'.* 0 sample\(s\) in 2 shard.*at least 1"),
    ],
)
def test_an_empty_or_too_small_split_is_refused_with_its_minimum(tiny_dataset, tmp_path, split, shards, match):
    _, manifest, _ = tiny_dataset
    original = manifest["splits"][split]
    if shards == "one":
        shards = [{**original[0], "samples": 1}]
    elif shards == "empty":
        shards = [{**s, "samples": 0} for s in original[:2]]
    cache = ShardCache(
        tmp_path / "c", ObjectStore(f"file://{tmp_path}/o"), PREFIX, _with_split(manifest, split, shards), budget_bytes=1 << 30
    )
    with pytest.raises(PartitionError, match=match):
        cache.prestage(split)
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("*.tar"))


def test_a_data_partition_without_samples_is_refused_by_number():
    shards = [{"path": f"s{i}.tar", "samples": n} for i, n in enumerate([4, 0, 4, 0])]
    with pytest.raises(PartitionError, match="partition 1 of 2 holds no sample"):
        partition_shards(shards, 2)
    assert [len(p) for p in partition_shards(shards, 1)] == [4]
