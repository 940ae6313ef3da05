"""The node-local shard cache: pre-stage a stage's shards from the object store, within a byte budget.

Layout mirrors the object store, so several datasets share one cache and one budget::

    <cache root>/<dataset name>/<version>/<split>/shard-NNNNN.tar
    <cache root>/<dataset name>/<version>/<split>/.shard-NNNNN.tar.ok     sha256, size and mtime at
                                                                           verification; its mtime is
                                                                           the shard's last use (LRU)
    <cache root>/.pins/<pid>-<id>.json                                     shards a reader holds

A shard enters the cache only one way: downloaded to ``.<name>.part`` (resuming a part left by
an interrupted download with a ranged read), sha256-verified against the dataset manifest,
then renamed into place. A mismatch is downloaded once more from scratch, then reported with
both hashes. Eviction removes least-recently-used shards of other splits, never a pinned shard
or one of the splits the caller must keep, and a request the budget cannot hold fails before
anything is downloaded. Per-shard file locks make concurrent pre-staging (a flow and an
operator's ``drape data prestage``) safe.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from drape import format_bytes
from drape.data.manifest import check_dataset_manifest
from drape.data.partition import check_split_samples
from drape.data.reader import read_shard
from drape.data.shards import ShardError, check_structure
from drape.layout import contained, shard_cache_dataset_dir
from drape.storage.checksum import sha256_file
from drape.storage.store import ObjectStore, StorageError

CHUNK_BYTES = 8 << 20  # local writes
REMOTE_BLOCK_BYTES = 32 << 20  # one ranged GET per 32 MiB: fewer round trips on 1 GB shards


class CacheError(RuntimeError):
    """Pre-staging that cannot succeed: budget, disk, checksum or store; names the shard and the numbers."""


@dataclass
class PrestageResult:
    stage: str
    shards: int
    bytes: int
    downloaded: int
    downloaded_bytes: int
    seconds: float
    evicted: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _open_own(path: Path, flags: int) -> int:
    """A file descriptor on `path` itself: a symlink in its place (planted to make drape write
    elsewhere) is refused, never followed."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise CacheError(f"shard cache file {path} is a symlink; drape writes only its own files (remove it)") from None
        raise


def _write_own(path: Path, payload: object) -> None:
    """`payload` as JSON at `path`, through a fresh temporary file renamed over it (a symlink at
    `path` is replaced, never written through)."""
    temporary = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    with os.fdopen(_open_own(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w") as handle:
        handle.write(json.dumps(payload))
    os.replace(temporary, path)


class ShardCache:
    """One dataset's view of a shard cache directory (see the module docstring)."""

    def __init__(
        self,
        root: str | Path,
        store: ObjectStore,
        prefix: str,
        manifest: dict,
        *,
        budget_bytes: int,
        concurrency: int = 4,
        read_ahead: int = 2,
    ):
        self.root = Path(root)
        self.store, self.prefix = store, prefix
        self.manifest = check_dataset_manifest(manifest, f"the manifest of {prefix}")
        self.dataset_dir = shard_cache_dataset_dir(self.root, manifest["name"], manifest["version"])
        self._inside = f"{manifest['name']}/{manifest['version']}"  # the dataset directory, relative to the root
        self.budget_bytes, self.concurrency, self.read_ahead = budget_bytes, concurrency, read_ahead
        self.read_wait_seconds = 0.0  # time a reader blocked on shards that were not local yet
        self._evict_lock = threading.Lock()

    @classmethod
    def from_config(cls, config, store: ObjectStore, prefix: str, manifest: dict) -> ShardCache:
        cache = config.data.cache
        return cls(
            config.cache_dir,
            store,
            prefix,
            manifest,
            budget_bytes=cache.budget_bytes,
            concurrency=cache.concurrency,
            read_ahead=cache.read_ahead,
        )

    # --- what the manifest says -------------------------------------------------------------
    def shards(self, split: str) -> list[dict]:
        splits = self.manifest["splits"]
        if split not in splits:
            raise CacheError(f"dataset {self.prefix} has no split {split!r}; it has {sorted(splits)}")
        check_split_samples(splits[split], split, f"dataset {self.prefix}")
        return splits[split]

    def split_bytes(self, split: str) -> int:
        return sum(shard["bytes"] for shard in self.shards(split))

    def local_path(self, shard: dict) -> Path:
        """Where the shard lives in the cache: never outside the cache root, whatever symlinks the
        dataset or split directories are (`contained`; a symlink loop is refused, named)."""
        what = f"shard path in the manifest of {self.prefix}"
        contained(self.root, f"{self._inside}/{shard['path']}", what)
        return contained(self.dataset_dir, shard["path"], what)

    def split_paths(self, split: str) -> list[Path]:
        return [self.local_path(shard) for shard in self.shards(split)]

    # --- one shard ----------------------------------------------------------------------------
    @staticmethod
    def _marker(local: Path) -> Path:
        return local.with_name(f".{local.name}.ok")

    def is_local(self, shard: dict) -> bool:
        """True when the shard is in place and unchanged since it was verified (no re-hash needed)."""
        local = self.local_path(shard)
        try:
            stat, recorded = local.stat(), json.loads(self._marker(local).read_text())
        except (OSError, ValueError):
            return False
        return (
            recorded.get("sha256") == shard["sha256"]
            and recorded.get("bytes") == stat.st_size == shard["bytes"]
            and recorded.get("mtime_ns") == stat.st_mtime_ns
        )

    @contextmanager
    def _locked(self, local: Path):
        local.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(_open_own(local.with_name(f".{local.name}.lock"), os.O_WRONLY | os.O_CREAT), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def fetch(self, shard: dict) -> Path:
        """The shard as a verified local file: kept if intact, else downloaded (resuming a part)."""
        local = self.local_path(shard)
        with self._locked(local):
            if self.is_local(shard):
                os.utime(self._marker(local))
                return local
            key = f"{self.prefix}/{shard['path']}"
            part = local.with_name(f".{local.name}.part")
            actual = ""
            for _attempt in range(2):  # a mismatch is re-downloaded once, from scratch
                self._download(key, part, shard["bytes"])
                actual = sha256_file(part)
                if actual == shard["sha256"] and part.stat().st_size == shard["bytes"]:
                    try:
                        check_structure(part)
                    except ShardError as error:  # the manifest vouches for a bad tar: nothing to retry
                        part.unlink(missing_ok=True)
                        raise CacheError(f"shard {self.store.key_url(key)}: {str(error).split(': ', 1)[1]}") from None
                    os.replace(part, local)
                    stat = local.stat()
                    _write_own(self._marker(local), {"sha256": actual, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns})
                    return local
                part.unlink(missing_ok=True)
            raise CacheError(
                f"shard {self.store.key_url(key)}: sha256 mismatch after a re-download: manifest says "
                f"{shard['sha256']}, the store serves {actual}; the dataset copy in the store is corrupt"
            )

    def _download(self, key: str, part: Path, size: int) -> None:
        if part.is_symlink():
            raise CacheError(f"shard cache file {part} is a symlink; drape writes only its own files (remove it)")
        offset = part.stat().st_size if part.exists() else 0
        if offset >= size:  # a complete (or overlong) part: verify it as is, or start over
            if offset > size:
                part.unlink()
            else:
                return
            offset = 0
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            with self.store.open_read(key, offset, REMOTE_BLOCK_BYTES) as remote, os.fdopen(_open_own(part, flags), "ab") as out:
                while chunk := remote.read(CHUNK_BYTES):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
        except StorageError as error:
            raise CacheError(f"shard {self.store.key_url(key)}: {error}") from None
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                part.unlink(missing_ok=True)
                free = shutil.disk_usage(part.parent).free
                what = "file size limit reached" if error.errno == errno.EFBIG else "disk full"
                raise CacheError(
                    f"shard cache {self.root}: {what} while pre-staging {key} ({size} bytes, "
                    f"{format_bytes(free)} free); the partial download was removed, the cache is "
                    f"consistent"
                ) from None
            raise

    # --- pins and eviction --------------------------------------------------------------------
    @contextmanager
    def pin(self, splits: Iterable[str]):
        """Mark the splits' shards in use (by this process) so no eviction removes them."""
        pins = contained(self.root, ".pins", "the shard cache's pins directory")
        pins.mkdir(parents=True, exist_ok=True)
        path = pins / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        _write_own(path, [str(p) for split in splits for p in self.split_paths(split)])
        try:
            yield
        finally:
            path.unlink(missing_ok=True)

    def _pinned(self) -> set[str]:
        pinned: set[str] = set()
        for path in (self.root / ".pins").glob("*.json"):
            pid = int(path.name.split("-", 1)[0])
            if not _pid_alive(pid):
                path.unlink(missing_ok=True)  # a reader that died holds nothing
                continue
            try:
                pinned.update(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return pinned

    def _cached_files(self) -> list[Path]:
        return [p for p in self.root.rglob("*.tar") if p.is_file() and not p.is_symlink()] if self.root.exists() else []

    def used_bytes(self) -> int:
        files = self._cached_files() + (list(self.root.rglob(".*.part")) if self.root.exists() else [])
        return sum(p.stat().st_size for p in files if p.is_file())

    def make_room(self, split: str, keep: Iterable[str] = (), shards: list[dict] | None = None) -> list[str]:
        """Evict LRU shards until `split` (or its `shards`) fits the budget; fail early if what must stay cannot fit."""
        keep = [s for s in dict.fromkeys([split, *keep]) if s in self.manifest["splits"]]
        self.root.mkdir(parents=True, exist_ok=True)
        with self._evict_lock:
            kept = {str(p) for s in keep for p in self.split_paths(s)}
            pinned = self._pinned()
            protected = kept | pinned
            must_stay = sum(self.split_bytes(s) for s in keep)
            pinned_elsewhere = sum(Path(p).stat().st_size for p in pinned - kept if Path(p).is_file())
            if must_stay + pinned_elsewhere > self.budget_bytes:
                parts = ", ".join(f"{s} {format_bytes(self.split_bytes(s))}" for s in keep)
                raise CacheError(
                    f"shard cache {self.root}: budget {format_bytes(self.budget_bytes)} cannot hold what must "
                    f"stay: {parts}"
                    + (f", shards in use {format_bytes(pinned_elsewhere)}" if pinned_elsewhere else "")
                    + "; raise data.cache.budget_bytes or cut smaller stages"
                )
            missing = sum(s["bytes"] for s in (self.shards(split) if shards is None else shards) if not self.is_local(s))
            used = self.used_bytes()
            evictable = sorted(
                (p for p in self._cached_files() if str(p) not in protected),
                key=lambda p: self._marker(p).stat().st_mtime if self._marker(p).exists() else 0.0,
            )
            evicted = []
            while used + missing > self.budget_bytes and evictable:
                victim = evictable.pop(0)
                used -= victim.stat().st_size
                self._remove(victim)
                evicted.append(str(victim.relative_to(self.root)))
            free = shutil.disk_usage(self.root).free
            if missing > free:
                raise CacheError(
                    f"shard cache {self.root}: {split} needs {format_bytes(missing)} more, the disk has "
                    f"{format_bytes(free)} free; nothing was downloaded"
                )
            return evicted

    def _remove(self, local: Path) -> None:
        for path in (self._marker(local), local, local.with_name(f".{local.name}.lock")):
            path.unlink(missing_ok=True)

    def evict(self, split: str) -> int:
        """Drop a split's shards (their originals stay in the object store); returns bytes freed."""
        freed = 0
        pinned = self._pinned()
        for local in self.split_paths(split):
            if str(local) in pinned:
                raise CacheError(f"shard {local} is in use by another reader; not evicting {split}")
            if local.is_file():
                freed += local.stat().st_size
            self._remove(local)
        split_dir = self.dataset_dir / split
        if split_dir.is_dir() and not any(p for p in split_dir.iterdir() if not p.name.endswith(".part")):
            shutil.rmtree(split_dir, ignore_errors=True)
        return freed

    # --- pre-staging and reading ---------------------------------------------------------------
    def prestage(
        self,
        split: str,
        *,
        keep: Iterable[str] = (),
        progress: Callable[[int, int], None] | None = None,
        shards: list[dict] | None = None,
    ) -> PrestageResult:
        """All of `split`'s shards (or the subset `shards`, one rank's) local and verified; idempotent, resumes."""
        started = time.perf_counter()
        shards = self.shards(split) if shards is None else shards
        evicted = self.make_room(split, keep, shards)
        missing = [s for s in shards if not self.is_local(s)]
        done = len(shards) - len(missing)
        if progress:
            progress(done, len(shards))
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="prestage") as pool:
            futures = [pool.submit(self.fetch, shard) for shard in missing]
            try:
                for future in as_completed(futures):
                    future.result()
                    done += 1
                    if progress:
                        progress(done, len(shards))
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
        return PrestageResult(
            split,
            len(shards),
            sum(s["bytes"] for s in shards),
            len(missing),
            sum(s["bytes"] for s in missing),
            time.perf_counter() - started,
            evicted,
        )

    def iter_local_shards(self, split: str, read_ahead: int | None = None, shards: list[dict] | None = None) -> Iterator[Path]:
        """`split`'s shards as verified local paths, in order, with the next `read_ahead` fetched ahead.

        Shards pre-staged already come straight from disk; a shard that is not local yet is
        fetched in the background while its predecessors are consumed, and the time spent
        waiting for it accumulates in `read_wait_seconds`. Read-ahead 0 with nothing pre-staged
        is demand paging: each shard fetched when the reader reaches it. The split stays pinned
        (safe from eviction) while the iterator is open.
        """
        read_ahead = self.read_ahead if read_ahead is None else read_ahead
        shards = self.shards(split) if shards is None else shards
        with self.pin([split]), ThreadPoolExecutor(max_workers=max(read_ahead, 1), thread_name_prefix="read-ahead") as pool:
            futures: dict[int, Future[Path]] = {}
            for index in range(len(shards)):
                for ahead in range(index, min(len(shards), index + 1 + read_ahead)):
                    if ahead not in futures:
                        futures[ahead] = pool.submit(self.fetch, shards[ahead])
                waited = time.perf_counter()
                local = futures.pop(index).result()
                self.read_wait_seconds += time.perf_counter() - waited
                yield local

    def iter_samples(self, split: str, read_ahead: int | None = None, shards: list[dict] | None = None) -> Iterator[dict]:
        """Decoded samples of `split` (or of its `shards`), shard by shard, read through `iter_local_shards`."""
        for local in self.iter_local_shards(split, read_ahead, shards):
            yield from read_shard(local)
