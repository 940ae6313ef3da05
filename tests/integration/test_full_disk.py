"""Full disks (ENOSPC) on the write paths a run meets (issue 68): a checkpoint save, a record, the
file:// object store (the live root's objects), a download, the shard cache. Each runs on a
size-limited tmpfs mounted in a mount namespace of its own (``unshare --mount --propagation private``,
root only, as tests/integration/nodes.py), fills it, and checks that the write fails naming the path
and the bytes needed, leaves no partial file a later step could take for whole, keeps what was
published before whole, and succeeds once the file system is grown (``mount -o remount,size=``):
the run resumes with nothing lost.

The scenarios run in a child process inside the namespace (`_in_small_disk`); each prints one JSON
line of what it saw, which the test checks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _mount_namespaces():
    """Small filesystems are mounted in a mount namespace of their own: root and unshare, which the
    suite's machines have (`make services`); a machine without them fails here, never skips."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("the full-disk tests mount small filesystems in a mount namespace: they need root and unshare")


def _in_small_disk(tmp_path: Path, scenario: str, size_kib: int, *args: object) -> dict:
    """Run `scenario` (a function of this module, given the disk and `args`) with a `size_kib` KiB
    tmpfs at tmp_path/disk, in a private mount namespace; its JSON line."""
    disk = tmp_path / "disk"
    disk.mkdir()
    code = (
        "import json, subprocess, sys; "
        f"subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size={size_kib}k', 'tmpfs', {str(disk)!r}], check=True); "
        f"from tests.integration.test_full_disk import {scenario} as run; "
        f"print(json.dumps(run({str(disk)!r}, *json.loads(sys.argv[1]))))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", code, json.dumps(args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _grow(disk: str, size_kib: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_kib}k", disk], check=True)


def _refused(call) -> str:
    from drape.storage.durable import DiskFullError

    try:
        call()
    except DiskFullError as error:
        return str(error)
    raise AssertionError("the write on a full disk was not refused with a DiskFullError")


def _files(disk: str) -> list[str]:
    return sorted(str(p.relative_to(disk)) for p in Path(disk).rglob("*"))


# --- scenarios (run inside the namespace) ---------------------------------------------------------
def checkpoint_scenario(disk: str) -> dict:
    """A first checkpoint of the tiny model fits; the second meets a full disk; after growing the disk it saves."""
    import yaml

    from drape.config import parse_config
    from drape.training.checkpoints.checkpoint import save_checkpoint, verify_checkpoint
    from drape.training.recipes.model import build_model
    from tests.conftest import TINY

    model = build_model(parse_config(yaml.safe_load(TINY.read_text()), str(TINY)))  # ~212 KiB of weights

    def save(name: str) -> Path:
        manifest = {"step": name}
        return save_checkpoint(Path(disk) / name, model=model, optimizer=None, trainable_names=[], ema=None, manifest=manifest)

    save("step-1")
    message = _refused(lambda: save("step-2"))
    after_failure = _files(disk)
    first = verify_checkpoint(Path(disk) / "step-1")["step"]
    _grow(disk, 2048)
    save("step-2")
    second = verify_checkpoint(Path(disk) / "step-2")["step"]
    return {"message": message, "after_failure": after_failure, "first": first, "second": second}


def record_and_store_scenario(disk: str) -> dict:
    """A record (publish_json) and file:// objects (put, get) on a full disk, then after growing it."""
    from drape.storage.durable import publish_json
    from drape.storage.store import ObjectStore

    store = ObjectStore(f"file://{disk}/objects")
    blob = Path(os.environ["TMPDIR"]) / "blob"
    blob.write_bytes(os.urandom(300 * 1024))
    store.put_bytes(b"first", "runs/r/first")
    seen = {"put": _refused(lambda: store.put_file(blob, "runs/r/blob"))}
    seen["record"] = _refused(lambda: publish_json(Path(disk) / "run.json", {"pad": "x" * 400_000}))
    outside = ObjectStore(f"file://{os.environ['TMPDIR']}/outside")
    outside.put_file(blob, "blob")
    seen["get"] = _refused(lambda: outside.get_file("blob", Path(disk) / "downloads" / "blob"))
    seen["after_failure"] = _files(disk)
    seen["listed"] = store.list("")
    _grow(disk, 4096)
    store.put_file(blob, "runs/r/blob")
    publish_json(Path(disk) / "run.json", {"pad": "x" * 400_000})
    outside.get_file("blob", Path(disk) / "downloads" / "blob", sha256=outside.sha256("blob"))
    seen["after_growing"] = store.list("")
    seen["first"] = store.read_bytes("runs/r/first").decode()
    return seen


def shard_cache_scenario(disk: str, objects: str, prefix: str, manifest: dict, neighbour: bool) -> dict:
    """Pre-staging a split onto a disk too small for it (`neighbour`: the disk had room when the
    cache looked, and another writer filled it while the first shard downloaded), then again once
    the disk is grown (and the neighbour's file removed)."""
    from drape.data.cache import CacheError, ShardCache
    from drape.storage.store import ObjectStore

    store = ObjectStore(f"file://{objects}")
    cache = ShardCache(Path(disk) / "cache", store, prefix, manifest, budget_bytes=1 << 30, concurrency=1)
    filler = Path(disk) / "neighbour"
    if neighbour:
        opened = store.open_read

        def open_then_fill(*args, **kwargs):
            if not filler.exists():
                with open(filler, "wb") as handle:  # everything left but a page
                    handle.write(b"\0" * max(shutil.disk_usage(disk).free - 4096, 0))
            return opened(*args, **kwargs)

        store.open_read = open_then_fill  # type: ignore[method-assign]
    try:
        cache.prestage("identity")
        message = ""
    except CacheError as error:
        message = str(error)
    after_failure = _files(disk)
    filler.unlink(missing_ok=True)  # the neighbour is gone: its space is free again
    store.__dict__.pop("open_read", None)
    _grow(disk, 8192)
    result = cache.prestage("identity")
    whole = all(cache.is_local(shard) for shard in cache.shards("identity"))
    return {"message": message, "after_failure": after_failure, "whole": whole, "downloaded": result.downloaded}


def queue_scenario(disk: str) -> dict:
    """Jobs submitted to a SQLite queue until its disk is full, then more once the disk is grown."""
    from scheduler.queue.schema import QueueError
    from scheduler.queue.store import JobSpec, JobStore

    store = JobStore(f"sqlite:///{disk}/queue.db")
    padding = {"PAD": "x" * 8000}  # each job a few pages
    submitted, message = [], ""
    for number in range(10_000):
        try:
            submitted.append(
                store.submit(
                    JobSpec(kind="stage-training", command=["true"], mem_gib=8, duration_s=60, env=padding, id=f"j{number}")
                )
            )
        except QueueError as error:
            message = str(error)
            break
    kept = [job["id"] for job in store.jobs()]
    _grow(disk, 16384)
    store.submit(JobSpec(kind="stage-training", command=["true"], mem_gib=8, duration_s=60, id="after"))
    return {"message": message, "submitted": submitted, "kept": kept, "after": [job["id"] for job in store.jobs()][-1:]}


# --- the tests ------------------------------------------------------------------------------------
def test_a_checkpoint_save_on_a_full_disk_names_path_and_bytes_leaves_nothing_partial_and_resumes(tmp_path):
    seen = _in_small_disk(tmp_path, "checkpoint_scenario", 400)  # one checkpoint of ~257 KiB fits, not two
    assert seen["message"].startswith(f"{tmp_path}/disk/step-2: disk full writing a checkpoint (about ")
    assert "needed" in seen["message"] and "free" in seen["message"] and "resume" in seen["message"]
    assert not [name for name in seen["after_failure"] if "step-2" in name]  # no partial .step-2.tmp
    assert seen["first"] == "step-1" and seen["second"] == "step-2"


def test_records_objects_and_downloads_on_a_full_disk_leave_no_partial_file_and_resume(tmp_path):
    seen = _in_small_disk(tmp_path, "record_and_store_scenario", 256)
    assert "runs/r/blob: disk full writing an object" in seen["put"] and "about 300.0 KiB needed" in seen["put"], seen
    assert "run.json: disk full writing a record" in seen["record"]
    assert "downloads/blob: disk full writing a download" in seen["get"] and "300.0 KiB needed" in seen["get"], seen
    assert not [name for name in seen["after_failure"] if ".tmp" in name], seen["after_failure"]
    assert seen["listed"] == ["runs/r/first"]
    assert seen["after_growing"] == ["runs/r/blob", "runs/r/first"] and seen["first"] == "first"


@pytest.mark.parametrize("neighbour", [False, True], ids=["seen-before", "filled-mid-download"])
def test_prestaging_onto_a_full_shard_cache_names_it_leaves_no_part_and_resumes(tmp_path, tiny_dataset, neighbour):
    from drape.data.dataset import publish_dataset
    from drape.storage.store import ObjectStore

    directory, manifest, _ = tiny_dataset
    prefix = "datasets/synth-tryon/v1"
    publish_dataset(directory, ObjectStore(f"file://{tmp_path / 'objects'}"), prefix)
    split = sum(shard["bytes"] for shard in manifest["splits"]["identity"])
    size_kib = split // 1024 + 64 if neighbour else max(split // 2048, 8)  # room for the split, or half of it
    args = (str(tmp_path / "objects"), prefix, manifest, neighbour)
    seen = _in_small_disk(tmp_path, "shard_cache_scenario", size_kib, *args)
    cache = f"shard cache {tmp_path}/disk/cache: "
    if neighbour:  # ENOSPC mid-download: the part is removed, the bytes named
        assert seen["message"].startswith(f"{cache}disk full while pre-staging {prefix}/identity/"), seen["message"]
        assert " bytes, " in seen["message"] and "the partial download was removed" in seen["message"]
    else:  # the cache sees it will not fit before downloading anything
        assert seen["message"].startswith(f"{cache}identity needs ") and "nothing was downloaded" in seen["message"]
    assert not [name for name in seen["after_failure"] if name.endswith(".part")], seen["after_failure"]
    assert seen["whole"] and seen["downloaded"] >= 1


def test_a_full_disk_under_the_queue_database_is_named_and_the_queue_resumes_whole(tmp_path):
    seen = _in_small_disk(tmp_path, "queue_scenario", 512)
    assert seen["message"].startswith(f"queue database {tmp_path}/disk/queue.db: disk full (it needs at least"), seen["message"]
    assert "free" in seen["message"] and "rolled back" in seen["message"]
    assert sorted(seen["kept"]) == sorted(seen["submitted"]) and len(seen["submitted"]) >= 1  # every accepted job, none half
    assert seen["after"] == ["after"]
