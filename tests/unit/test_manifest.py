"""Dataset manifests (drape/data/manifest.py): a shard path, name or version that would leave the
cache is refused naming the field, before the cache touches a file; a manifest that is not JSON is named."""

from __future__ import annotations

import json

import pytest

from drape.data.cache import ShardCache
from drape.data.manifest import ManifestError, check_dataset_manifest, read_manifest
from drape.storage.store import ObjectStore

SHA = "0" * 64


def _manifest(path: str, **fields) -> dict:
    shard = {"path": path, "bytes": 10, "sha256": SHA, "samples": 1}
    return {"name": "synthetic", "version": "v1", "splits": {"identity": [shard], "control": [shard]}, **fields}


@pytest.mark.parametrize(
    ("manifest", "match"),
    [
        (_manifest("../../../outside/evil.tar"), r"splits\.identity\[0\]\.path"),
        (_manifest("/abs/evil.tar"), "absolute"),
        (_manifest("identity/shard-00000.tar", name="../up"), "name"),
        (_manifest("identity/shard-00000.tar", version="v1/../../x"), "version"),
        ({"name": "synthetic", "version": "v1", "splits": {"identity": [{"path": "a.tar"}]}}, "bytes and samples"),
        ([], "expected a JSON object"),
    ],
)
def test_dataset_manifests_that_leave_the_cache_are_refused(manifest, match):
    with pytest.raises(ManifestError, match=match):
        check_dataset_manifest(manifest, "s3://bucket/datasets/synthetic/v1/manifest.json")


def test_prestage_and_eviction_never_touch_a_file_outside_the_cache(tmp_path):
    """The attack of the issue: a shard path of ../../../outside/evil.tar in the store's manifest."""
    store = ObjectStore(f"file://{tmp_path}/objects")
    victim = tmp_path / "outside" / "evil.tar"
    victim.parent.mkdir()
    victim.write_text("not the cache's")
    store.put_bytes(json.dumps(_manifest("../../../outside/evil.tar")).encode(), "datasets/synthetic/v1/manifest.json")
    with pytest.raises(ManifestError, match="evil.tar"):
        read_manifest(store, "datasets/synthetic/v1")
    with pytest.raises(ManifestError):
        ShardCache(
            tmp_path / "cache", store, "datasets/synthetic/v1", _manifest("../../../outside/evil.tar"), budget_bytes=1 << 30
        )
    assert victim.read_text() == "not the cache's"


def test_a_manifest_that_is_not_json_names_the_object(tmp_path):
    store = ObjectStore(f"file://{tmp_path}/objects")
    store.put_bytes(b"{not json", "datasets/synthetic/v1/manifest.json")
    with pytest.raises(ManifestError, match=r"manifest\.json: not JSON"):
        read_manifest(store, "datasets/synthetic/v1")
