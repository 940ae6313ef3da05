"""The shard cache: verified, atomic, resumable pre-staging within a byte budget; read-ahead reading;
symlinks planted in it are refused or replaced, never written through."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from drape.data.cache import CacheError, ShardCache
from drape.data.dataset import MANIFEST, load_split, publish_dataset
from drape.layout import UnsafePathError
from drape.storage.store import ObjectStore

PREFIX = "datasets/synth-tryon/v1"


class SpyStore(ObjectStore):
    """A real file:// store that records every ranged open and can corrupt the first N reads."""

    def __init__(self, url, corrupt_reads=0):
        super().__init__(url)
        self.opens: list[tuple[str, int]] = []
        self.corrupt_reads = corrupt_reads

    def open_read(self, key, offset=0, block_bytes=8 << 20):
        self.opens.append((key, offset))
        handle = super().open_read(key, offset, block_bytes)
        if self.corrupt_reads > 0:
            self.corrupt_reads -= 1
            payload = bytearray(handle.read())
            handle.close()
            payload[len(payload) // 2] ^= 0xFF
            import io

            return io.BytesIO(bytes(payload))
        return handle


@pytest.fixture
def published(tiny_dataset, tmp_path):
    directory, manifest, _ = tiny_dataset
    store = SpyStore(f"file://{tmp_path / 'objects'}")
    publish_dataset(directory, store, PREFIX)
    return store, manifest


def _cache(tmp_path, store, manifest, **kwargs):
    return ShardCache(tmp_path / "cache", store, PREFIX, manifest, **{"budget_bytes": 1 << 30, **kwargs})


def _split_bytes(manifest, split):
    return sum(s["bytes"] for s in manifest["splits"][split])


def test_prestage_verifies_renames_atomically_and_is_idempotent(published, tmp_path):
    store, manifest = published
    cache = _cache(tmp_path, store, manifest, concurrency=3)
    result = cache.prestage("identity")
    assert result.shards == len(manifest["splits"]["identity"]) == result.downloaded > 1
    assert result.bytes == result.downloaded_bytes == _split_bytes(manifest, "identity")
    for shard in manifest["splits"]["identity"]:
        assert cache.is_local(shard)
    assert not list((tmp_path / "cache").rglob("*.part"))
    store.opens.clear()
    again = cache.prestage("identity")
    assert again.downloaded == 0 and store.opens == []


def test_a_partial_download_resumes_from_where_it_stopped(published, tmp_path):
    store, manifest = published
    cache = _cache(tmp_path, store, manifest)
    shard = manifest["splits"]["texture"][0]
    local = cache.local_path(shard)
    local.parent.mkdir(parents=True)
    half = shard["bytes"] // 2
    with store.open_read(f"{PREFIX}/{shard['path']}") as remote:
        local.with_name(f".{local.name}.part").write_bytes(remote.read(half))
    store.opens.clear()
    cache.fetch(shard)
    assert store.opens == [(f"{PREFIX}/{shard['path']}", half)]
    assert cache.is_local(shard)


def test_a_bad_download_is_retried_once_then_succeeds(published, tmp_path):
    store, manifest = published
    store.corrupt_reads = 1
    cache = _cache(tmp_path, store, manifest)
    shard = manifest["splits"]["geometry"][0]
    cache.fetch(shard)
    assert len(store.opens) == 2 and cache.is_local(shard)


def test_a_corrupt_store_copy_fails_naming_the_shard_and_both_hashes(published, tmp_path):
    store, manifest = published
    shard = manifest["splits"]["geometry"][0]
    remote = tmp_path / "objects" / PREFIX / shard["path"]
    data = bytearray(remote.read_bytes())
    data[100] ^= 0xFF
    remote.write_bytes(bytes(data))
    cache = _cache(tmp_path, store, manifest)
    with pytest.raises(CacheError) as error:
        cache.prestage("geometry")
    message = str(error.value)
    assert shard["path"] in message and shard["sha256"] in message and "re-download" in message
    assert len([o for o in store.opens if o[0].endswith(shard["path"])]) == 2
    assert not cache.is_local(shard) and not list((tmp_path / "cache").rglob("*.part"))


def test_budget_that_cannot_hold_what_must_stay_fails_before_downloading(published, tmp_path):
    store, manifest = published
    budget = _split_bytes(manifest, "identity") + _split_bytes(manifest, "control") - 1
    cache = _cache(tmp_path, store, manifest, budget_bytes=budget)
    with pytest.raises(CacheError, match=r"budget .* cannot hold what must stay: identity .*, control"):
        cache.prestage("identity", keep=["control"])
    assert store.opens == [] and not list((tmp_path / "cache").rglob("*.tar"))


def test_eviction_drops_least_recently_used_never_kept_or_pinned(published, tmp_path):
    store, manifest = published
    sizes = {split: _split_bytes(manifest, split) for split in ("control", "identity", "texture", "geometry", "denoise")}
    budget = sizes["control"] + sizes["identity"] + sizes["texture"] + 1024
    cache = _cache(tmp_path, store, manifest, budget_bytes=budget)
    cache.prestage("control")
    cache.prestage("identity", keep=["control"])
    cache.prestage("texture", keep=["control", "identity"])
    # geometry next: identity is done, texture still training
    result = cache.prestage("geometry", keep=["control", "texture"])
    assert result.evicted and all("/identity/" in path for path in result.evicted)
    assert all(cache.is_local(s) for split in ("control", "texture", "geometry") for s in manifest["splits"][split])
    # a reader pins denoise elsewhere; prestaging identity again may not evict it
    with cache.pin(["geometry"]):
        with pytest.raises(CacheError, match="shards in use"):
            cache.prestage("identity", keep=["control", "texture"])
    assert all(cache.is_local(s) for s in manifest["splits"]["geometry"])


def test_a_pin_left_by_a_dead_process_does_not_block_eviction(published, tmp_path):
    store, manifest = published
    cache = _cache(tmp_path, store, manifest)
    cache.prestage("denoise")
    pins = tmp_path / "cache" / ".pins"
    pins.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (pins / f"{dead.stdout.strip()}-deadbeef.json").write_text(json.dumps([str(p) for p in cache.split_paths("denoise")]))
    assert cache.evict("denoise") > 0
    assert not list(pins.iterdir())


def test_read_ahead_reader_matches_the_shards_and_fetches_what_is_missing(published, tmp_path, tiny_dataset):
    store, manifest = published
    directory = tiny_dataset[0]
    cache = _cache(tmp_path, store, manifest, read_ahead=2)
    keys = [sample["key"] for sample in cache.iter_samples("identity")]
    assert keys == load_split(directory, manifest, "identity")["keys"]
    assert all(cache.is_local(s) for s in manifest["splits"]["identity"])
    assert not list((tmp_path / "cache" / ".pins").iterdir())
    with pytest.raises(CacheError, match="has no split 'shoes'"):
        list(cache.iter_samples("shoes"))


def test_disk_full_leaves_the_cache_consistent(published, tmp_path):
    """A real write failure: the child process may not write files over 64 KiB (RLIMIT_FSIZE)."""
    store, manifest = published
    shard = max(manifest["splits"]["identity"], key=lambda s: s["bytes"])
    assert shard["bytes"] > 65536
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    script = textwrap.dedent(f"""
        import json, resource
        from drape.data.cache import CacheError, ShardCache
        from drape.storage.store import ObjectStore
        manifest = json.load(open({str(tmp_path / "manifest.json")!r}))
        cache = ShardCache({str(tmp_path / "cache")!r}, ObjectStore({f"file://{tmp_path / 'objects'}"!r}), {PREFIX!r}, manifest,
                           budget_bytes=1 << 30)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        try:
            cache.prestage("identity")
        except CacheError as error:
            print("CacheError:", error)
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()}
    )
    assert "CacheError:" in result.stdout and "file size limit" in result.stdout and "cache is consistent" in result.stdout, (
        result.stdout + result.stderr
    )
    assert not list((tmp_path / "cache").rglob("*.part"))
    cache = _cache(tmp_path, store, manifest)
    for path in (tmp_path / "cache").rglob("*.tar"):  # whatever made it in is whole and verified
        entry = next(s for s in manifest["splits"]["identity"] if path.name in s["path"])
        assert cache.is_local(entry)
    assert cache.prestage("identity").shards == len(manifest["splits"]["identity"])
    assert (tmp_path / "objects" / PREFIX / MANIFEST).is_file()


# --- symlinks planted in the cache ----------------------------------------------------------------
@pytest.fixture
def cache_parts(tiny_dataset, tmp_path):
    directory, manifest, _ = tiny_dataset
    store = ObjectStore(f"file://{tmp_path / 'objects'}")
    publish_dataset(directory, store, PREFIX)
    cache = ShardCache(tmp_path / "cache", store, PREFIX, manifest, budget_bytes=1 << 30)
    shard = manifest["splits"]["identity"][0]
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    return cache, shard, victim


@pytest.mark.parametrize("sidecar", ["part", "lock"])
def test_a_planted_sidecar_symlink_is_refused_and_never_written_through(cache_parts, sidecar):
    cache, shard, victim = cache_parts
    local = cache.dataset_dir / shard["path"]
    local.parent.mkdir(parents=True)
    link = local.with_name(f".{local.name}.{sidecar}")
    link.symlink_to(victim)
    with pytest.raises(CacheError, match=rf"\.{sidecar} is a symlink"):
        cache.fetch(shard)
    assert victim.read_text() == "precious"


def test_a_planted_marker_symlink_is_replaced_not_written_through(cache_parts):
    cache, shard, victim = cache_parts
    local = cache.dataset_dir / shard["path"]
    local.parent.mkdir(parents=True)
    (local.with_name(f".{local.name}.ok")).symlink_to(victim)
    assert cache.fetch(shard) == local and cache.is_local(shard)
    assert victim.read_text() == "precious" and not local.with_name(f".{local.name}.ok").is_symlink()


@pytest.mark.parametrize("where", ["dataset", "split", "pins"])
def test_a_cache_directory_symlinked_outside_the_root_is_refused(cache_parts, tmp_path, where):
    cache, shard, _ = cache_parts
    outside = tmp_path / "outside"
    outside.mkdir()
    link = {"dataset": cache.dataset_dir, "split": cache.dataset_dir / "identity", "pins": cache.root / ".pins"}[where]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="outside"):
        if where == "pins":
            with cache.pin(["identity"]):
                pass
        else:
            cache.prestage("identity")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("loop", ["shard", "split"])
def test_a_symlink_loop_is_refused_with_the_path_named(cache_parts, loop):
    cache, shard, _ = cache_parts
    split = cache.dataset_dir / "identity"
    if loop == "split":
        cache.dataset_dir.mkdir(parents=True)
        split.symlink_to("identity")
    else:
        split.mkdir(parents=True)
        (split / "a").symlink_to("b")
        (split / "b").symlink_to("a")
        (split / Path(shard["path"]).name).symlink_to("a")
    with pytest.raises(UnsafePathError, match="symlink loop") as error:
        cache.fetch(shard)
    assert shard["path"] in str(error.value)
