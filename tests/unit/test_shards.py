"""Shards: round trip, checksums, and clear errors for corrupt, truncated or hostile files."""

import io
import tarfile

import numpy as np
import pytest

from drape.data.shards import IMAGE_FIELDS, ShardError, ShardWriter, read_shard, verify_shard
from drape.data.synth import generate_split


def _samples(count=5):
    return list(generate_split(seed=3, split="denoise", num_samples=count, num_identities=4, num_garments=4, resolution=32))


def test_round_trip_and_manifest_entries(tmp_path):
    samples = _samples(5)
    with ShardWriter(out_dir=tmp_path / "denoise", root=tmp_path, max_samples=2) as writer:
        for sample in samples:
            writer.write(sample)
    assert [s.samples for s in writer.shards] == [2, 2, 1]
    assert [s.path for s in writer.shards] == [f"denoise/shard-{i:05d}.tar" for i in range(3)]
    assert not list(tmp_path.rglob("*.tmp"))
    decoded = [s for info in writer.shards for s in read_shard(tmp_path / info.path, sha256=info.sha256, size=info.bytes)]
    assert [s["key"] for s in decoded] == [s.key for s in samples]
    first = decoded[0]
    assert first["meta"] == samples[0].meta | {"identity": first["meta"]["identity"], "garment": first["meta"]["garment"]}
    np.testing.assert_array_equal(first["target"], np.asarray(samples[0].target))
    assert set(IMAGE_FIELDS) <= set(first)
    assert first["mask"].ndim == 2 and first["target"].shape == (32, 32, 3)


def _one_shard(tmp_path):
    with ShardWriter(out_dir=tmp_path, root=tmp_path, max_samples=8) as writer:
        for sample in _samples(3):
            writer.write(sample)
    return tmp_path / writer.shards[0].path, writer.shards[0]


def test_corrupt_shard_names_the_shard_and_both_hashes(tmp_path):
    path, info = _one_shard(tmp_path)
    data = bytearray(path.read_bytes())
    data[2000] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError) as error:
        list(read_shard(path, sha256=info.sha256))
    assert str(path) in str(error.value) and info.sha256 in str(error.value) and "mismatch" in str(error.value)


def test_truncated_shard_is_rejected_with_and_without_a_hash(tmp_path):
    path, info = _one_shard(tmp_path)
    path.write_bytes(path.read_bytes()[: info.bytes // 2])
    with pytest.raises(ShardError, match=rf"shard {path}: expected {info.bytes} bytes"):
        verify_shard(path, sha256=info.sha256, size=info.bytes)
    with pytest.raises(ShardError, match=str(path)):
        list(read_shard(path))


def test_member_escaping_the_directory_is_rejected(tmp_path):
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tar:
        payload = b"{}"
        info = tarfile.TarInfo("../escape.json")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    with pytest.raises(ShardError, match="unexpected member '../escape.json'"):
        list(read_shard(path))


def test_missing_shard(tmp_path):
    with pytest.raises(ShardError, match="missing"):
        verify_shard(tmp_path / "nope.tar", sha256="0" * 64)
