"""Object store over fsspec: verified, atomic, idempotent; URLs logged without secrets."""

import pytest

from drape.storage.store import ObjectStore, StorageError, redact_url


def test_put_get_round_trip_is_verified(tmp_path):
    store = ObjectStore(f"file://{tmp_path / 'objects'}")
    local = tmp_path / "a.bin"
    local.write_bytes(b"x" * 1000)
    stored = store.put_file(local, "k/a.bin")
    assert stored.bytes == 1000 and store.exists("k/a.bin")
    assert store.list("k") == ["k/a.bin"]  # no temporary names left behind
    out = store.get_file("k/a.bin", tmp_path / "back" / "a.bin", sha256=stored.sha256)
    assert out.read_bytes() == b"x" * 1000
    with pytest.raises(StorageError, match="does not match expected"):
        store.get_file("k/a.bin", tmp_path / "bad", sha256="0" * 64)
    assert not (tmp_path / "bad").exists()


def test_errors_name_the_object(tmp_path):
    store = ObjectStore(f"file://{tmp_path / 'objects'}")
    with pytest.raises(StorageError, match="cannot upload, file not found"):
        store.put_file(tmp_path / "missing", "k")
    with pytest.raises(StorageError, match="missing in the object store"):
        store.read_bytes("nope")
    with pytest.raises(StorageError, match=r"objects/nope: missing"):
        store.verify("nope", size=1, sha256="x")


def test_redact_url_drops_credentials_and_query():
    assert redact_url("s3://KEY:SECRET@bucket/prefix?X-Amz-Signature=abc") == "s3://bucket/prefix"
    assert redact_url("http://user:pw@127.0.0.1:9000/b") == "http://127.0.0.1:9000/b"
