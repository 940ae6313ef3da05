"""drape.data.reader: random access into local shards gives exactly what reading them whole gives."""

from __future__ import annotations

import io
import shutil
import tarfile

import numpy as np
import pytest

from drape.data.dataset import stack_samples
from drape.data.reader import ShardIndex, read_shard
from drape.data.shards import ShardError


@pytest.fixture(scope="module")
def texture_shards(tiny_dataset):
    directory, manifest, _ = tiny_dataset
    return [directory / shard["path"] for shard in manifest["splits"]["texture"]]


def test_the_index_reads_what_the_whole_shards_hold_in_the_same_order(texture_shards):
    index = ShardIndex(texture_shards)
    whole = stack_samples(sample for path in texture_shards for sample in read_shard(path))
    assert index.keys == whole["keys"] and len(index) == len(whole["keys"]) > 10
    picked = [7, 0, 7, len(index) - 1]  # any order, repeats: a step's draw with replacement
    taken = index.take(picked)
    assert taken["keys"] == [whole["keys"][i] for i in picked] and taken["meta"] == [whole["meta"][i] for i in picked]
    for field in ("target", "agnostic", "mask", "pose", "garment", "garment_mask"):
        assert taken[field].dtype == whole[field].dtype and np.array_equal(taken[field], whole[field][picked]), field


def test_the_index_holds_offsets_not_samples(texture_shards):
    index = ShardIndex(texture_shards)
    # 116 bytes per sample whatever the resolution (a decoded 1024 px sample holds megabytes)
    assert index.spans.nbytes + index.shard_of.nbytes <= 116 * len(index)


def _corrupt_member(source, target, member_suffix: str) -> str:
    """A copy of the shard with one member's image bytes overwritten, tar structure intact."""
    shutil.copy(source, target)
    with tarfile.open(target, "r:") as tar:
        member = next(m for m in tar if m.name.endswith(member_suffix))
    with open(target, "r+b") as handle:
        handle.seek(member.offset_data + 16)
        handle.write(b"\0" * min(64, member.size - 16))
    return member.name


def test_an_undecodable_member_names_the_shard_and_the_member(texture_shards, tmp_path):
    broken = tmp_path / "shard-broken.tar"
    name = _corrupt_member(texture_shards[0], broken, ".garment.png")
    index = ShardIndex([broken])
    row = index.keys.index(name.split(".")[0])
    with pytest.raises(ShardError, match=rf"shard {broken}: member '{name}' cannot be decoded"):
        index.take([row])


def test_a_member_missing_from_a_sample_is_found_when_indexing(tmp_path):
    path = tmp_path / "shard-partial.tar"
    with tarfile.open(path, "w") as tar:
        for name in ("k1.target.png", "k1.json"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(ShardError, match=r"sample 'k1' lacks \['agnostic', 'mask', 'pose', 'garment', 'garment_mask'\]"):
        ShardIndex([path])


def test_an_index_travels_to_worker_processes_without_its_open_files(texture_shards):
    import pickle

    index = ShardIndex(texture_shards)
    index.take([0])
    copy = pickle.loads(pickle.dumps(index))
    assert copy._files == {} and copy.keys == index.keys and np.array_equal(copy.take([3])["target"], index.take([3])["target"])
