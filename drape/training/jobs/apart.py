"""A stage job on a node of its own: what it takes from the object store and gives back to it.

Nodes share nothing but the store (docs/topology.md), so a queue job's trainer
- fetches the weights it starts from (`fetch_init`) and, when this node has no checkpoint of the
  stage as new as the store's, the store's newest (`restore_newest`): a stage resumes on any node;
  across nodes, every node resumes from the one rank 0 finds newest and whole in the store
  (`align_to`), since each node publishes its own ranks' shards;
- publishes every checkpoint once saved, in the background, one at a time (`CheckpointPublisher`):
  the loop never waits on an upload, and the job is not done until every upload is verified;
- warms this node's shard cache with the next stage's shards while it trains (`warm_next`), so
  that stage, which the queue places on the node whose cache is warm, reads from local disk;
- publishes its result, then frees its stage folder (`StageJob.run`): the node's disk is a cache.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from drape import next_stage
from drape.jsonfile import read_json_object
from drape.layout import checkpoint_dirs, checkpoint_order, checkpoint_step
from drape.storage.bases import fetch_bases
from drape.storage.handoff import fetch_checkpoint, get_tree, newest_published, publish_checkpoint, published
from drape.storage.store import ObjectStore, remove_tree
from drape.training.loop.state import resume_point


class CheckpointPublisher:
    """Publishes each saved checkpoint folder to the store in the background, in save order."""

    def __init__(self, store: ObjectStore, policy, *, run_id: str, stage: str):
        self.store, self.policy, self.run_id, self.stage = store, policy, run_id, stage
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drape-publish")
        self.futures: list[Future] = []
        self.seconds = 0.0  # time spent uploading and verifying (off the training loop)

    def __call__(self, path: Path) -> None:
        self.futures.append(self.pool.submit(self._publish, Path(path)))

    def _publish(self, path: Path) -> int:
        started = time.perf_counter()
        sent = publish_checkpoint(self.store, path, self.policy, run_id=self.run_id, stage=self.stage)
        self.seconds += time.perf_counter() - started
        return sent

    def close(self, *, raise_errors: bool = True, final: Path | None = None) -> int:
        """Wait for every upload; the bytes sent. The first failure is raised (unless told not to).
        `final`, the checkpoint the job ends on, is published too when this node's part of it is not
        in the store yet: a retry that resumed from a last-step checkpoint its killed run saved but
        never published trains no step and saves nothing, and the pipeline fetches it from the store."""
        self.pool.shutdown(wait=True)
        sent, failure = 0, None
        for future in self.futures:
            error = future.exception()
            if error is None:
                sent += future.result()
            elif failure is None:
                failure = error
        if failure is None and final is not None and not self._recorded(Path(final)):
            try:
                sent += self._publish(Path(final))
            except Exception as error:  # noqa: BLE001 (said as a publishing failure below)
                failure = error
        if failure is not None and raise_errors:
            raise RuntimeError(f"stage {self.stage}: a checkpoint could not be published to {self.store!r}: {failure}")
        return sent

    def _recorded(self, path: Path) -> bool:
        """Whether the store records every file of this node's copy of checkpoint `path` that its manifest lists."""
        if path.parent.name != "checkpoints":
            return True  # the starting weights (init/), never trained on: not the stage's to publish
        try:
            listed = read_json_object(path / "manifest.json", "checkpoint manifest").get("files", {})
        except (OSError, ValueError, AttributeError):
            return True  # no manifest here: not a checkpoint this node can publish whole
        here = {name for name in (listed if isinstance(listed, dict) else {}) if (path / name).is_file()} | {"manifest.json"}
        records = published(self.store, self.run_id, self.stage, path.parent.name).get(path.name, [])
        return here <= {record["key"].split(f"/{path.name}/", 1)[1] for record in records}


def fetch_init(store: ObjectStore, key: str, stage_dir: Path, *, bases: Path | None = None) -> Path:
    """The published starting weights in the stage folder's ``init/`` (freed with it at the job's end)."""
    local = stage_dir / "init"
    if not (local / "manifest.json").is_file():
        get_tree(store, key, local)
    fetch_bases(store, [local], bases)
    return local


def restore_newest(store: ObjectStore, run_id: str, stage: str, stage_dir: Path, *, bases: Path | None = None) -> Path | None:
    """The store's newest checkpoint of the stage in `stage_dir`, when this node has none as new
    (another node trained further before it was lost); None when the local one is newest."""
    name = newest_published(store, run_id, stage)
    local = resume_point(stage_dir / "checkpoints")
    if name is None or (local is not None and checkpoint_step(local) >= checkpoint_step(name)):
        return None
    return fetch_checkpoint(store, run_id, stage, name, stage_dir / "checkpoints", bases=bases)


def whole_here(checkpoint: Path) -> bool:
    """Whether every file the checkpoint's manifest lists is in this node's copy (on a node of a
    multi-node job that shares no disk, a sharded checkpoint holds only its own ranks' shards)."""
    try:
        listed = read_json_object(checkpoint / "manifest.json", "checkpoint manifest").get("files", {})
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(listed, dict) and all((checkpoint / name).is_file() for name in listed)


def align_to(
    store: ObjectStore, run_id: str, stage: str, stage_dir: Path, name: str | None, *, bases: Path | None = None
) -> Path | None:
    """A multi-node job's nodes all resume from `name`, the store's newest whole checkpoint (rank 0
    chose it): checkpoints here newer than it were never whole anywhere (a node was lost before its
    shards were published) and go; `name` is fetched unless this node has it whole."""
    directory = stage_dir / "checkpoints"
    for path in checkpoint_dirs(directory):
        if name is None or checkpoint_order(path) > checkpoint_order(name):
            print(f"train-{stage}: {path.name} is not whole on every node; resuming from {name or 'the start'}", flush=True)
            remove_tree(path)
    if name is None or whole_here(directory / name):
        return None
    return fetch_checkpoint(store, run_id, stage, name, directory, bases=bases)


class NextStageWarmer:
    """Pre-stages the next stage's shards into this node's cache while the current stage trains.

    A daemon thread: the job never waits for it at its end (the GPUs would idle), and a download
    cut short leaves only a temporary file the cache ignores and the next fetch replaces."""

    def __init__(self, cache, stage: str):
        self.upcoming = next_stage(stage)
        self.result: dict | None = None
        self.error: str | None = None
        self.thread: threading.Thread | None = None
        if self.upcoming is not None:
            self.thread = threading.Thread(target=self._run, args=(cache, stage), name="drape-warm-next", daemon=True)
            self.thread.start()

    def _run(self, cache, stage: str) -> None:
        try:
            self.result = cache.prestage(self.upcoming, keep=["control", stage]).to_dict()
        except Exception as error:  # noqa: BLE001 - a cold cache costs data-wait, never the stage
            self.error = f"{type(error).__name__}: {error}"

    def summary(self) -> dict:
        """What it staged by now, for the job's result: {stage, done, bytes, error}."""
        return {
            "stage": self.upcoming,
            "done": self.result is not None,
            "bytes": (self.result or {}).get("bytes", 0),
            "error": self.error,
        }
