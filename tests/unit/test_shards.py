"""Shards: round trip, checksums, and clear errors for corrupt, truncated or hostile files."""

import io
import tarfile

import numpy as np
import pytest

from drape.data.reader import read_shard
from drape.data.shards import IMAGE_FIELDS, ShardError, ShardWriter, check_structure, verify_shard
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


def _tar_with(path, name, kind=tarfile.REGTYPE, payload=b"{}"):
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo(name)
        info.type = kind
        if kind == tarfile.SYMTYPE:
            info.linkname = "/etc/passwd"
        info.size = len(payload) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(payload) if kind == tarfile.REGTYPE else None)
    return path


@pytest.mark.parametrize(
    "name, kind, message",
    [
        ("../escape.json", tarfile.REGTYPE, "escapes the shard directory"),
        ("/etc/cron.d/x.json", tarfile.REGTYPE, "escapes the shard directory"),
        ("sub/dir.json", tarfile.REGTYPE, "escapes the shard directory"),
        ("a.target.png", tarfile.SYMTYPE, "is a symbolic link"),
        ("a.target.png", tarfile.LNKTYPE, "is a hard link"),
        ("a.target.png", tarfile.CHRTYPE, "is a character device"),
        ("a.target.png", tarfile.FIFOTYPE, "is a fifo"),
    ],
)
def test_hostile_members_are_rejected_by_reader_and_structure_check(tmp_path, name, kind, message):
    path = _tar_with(tmp_path / "evil.tar", name, kind)
    with pytest.raises(ShardError, match=message) as error:
        list(read_shard(path))
    assert str(path) in str(error.value) and repr(name) in str(error.value)
    with pytest.raises(ShardError, match=message):
        check_structure(path)


def test_structure_check_catches_truncation_and_passes_good_shards(tmp_path):
    path, info = _one_shard(tmp_path)
    assert check_structure(path) == 3 * (len(IMAGE_FIELDS) + 1)
    path.write_bytes(path.read_bytes()[: info.bytes // 2])
    with pytest.raises(ShardError, match=rf"shard {path}: (truncated|not a readable tar)"):
        check_structure(path)


def test_writer_closes_shards_at_max_bytes(tmp_path):
    samples = _samples(6)
    with ShardWriter(out_dir=tmp_path / "s", root=tmp_path, max_samples=100, max_bytes=1) as writer:
        for sample in samples:
            writer.write(sample)
    assert [s.samples for s in writer.shards] == [1] * 6


def test_missing_shard(tmp_path):
    with pytest.raises(ShardError, match="missing"):
        verify_shard(tmp_path / "nope.tar", sha256="0" * 64)
