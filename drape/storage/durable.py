"""Durability before a rename publishes: the bytes and the directory entry reach the disk first.

A rename is atomic but not durable: after a power loss the new name can point at a file whose
data never left the page cache. Whatever drape publishes by rename (file:// objects, checkpoints,
baselines, run records) is fsynced first, and its directory after, before the live copy it
replaces may be freed.

A full disk (ENOSPC, or a quota: EDQUOT) is met the same way on every write path (`whole_or_nothing`):
the partial temporary copy is removed at once (it would hold the space the run needs, and nothing
half-written may be taken for whole), and a `DiskFullError` names the path, the bytes needed and
the bytes free. What was published before stays whole, so the run resumes once space is freed.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_WORDS = ("No space left on device", "Disk quota exceeded", "os error 28", "os error 122", "StorageFull")


class DiskFullError(OSError):
    """A write that met a full disk; the message names the path and the bytes needed and free."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` is a full disk or quota: an OSError's errno, or the words a native writer
    (safetensors' Rust I/O error) wraps it in."""
    if isinstance(error, OSError) and error.errno in DISK_FULL:
        return True
    return any(words in str(error) for words in _DISK_FULL_WORDS)


def free_bytes(path: str | Path) -> int:
    """Bytes free to this user on the file system holding `path` (or its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def disk_full(path: str | Path, needed: int | None, what: str) -> DiskFullError:
    from drape import format_bytes

    need = f"about {format_bytes(needed)} needed, " if needed else ""
    return DiskFullError(
        f"{path}: disk full writing {what} ({need}{format_bytes(free_bytes(path))} free); the partial copy was "
        "removed and what was published before is whole: free space (or raise the quota) and run again to resume"
    )


def remove_partial(path: str | Path) -> None:
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def whole_or_nothing(
    temporary: str | Path, final: str | Path, what: str, needed: int | Callable[[], int] | None = None
) -> Iterator[None]:
    """Around writing `temporary` (a file or folder later renamed to `final`): on a full disk the
    partial `temporary` is removed and a DiskFullError names `final`, the bytes `needed` (a count,
    or a call that finds it, made only then) and those free."""
    try:
        yield
    except BaseException as error:
        if not is_disk_full(error) or isinstance(error, DiskFullError):
            raise
        remove_partial(temporary)
        raise disk_full(final, _count(needed), what) from None


def _count(needed: int | Callable[[], int] | None) -> int | None:
    if not callable(needed):
        return needed
    try:
        return needed()
    except Exception:  # noqa: BLE001 - the size is a courtesy in the message; the disk-full error must still be raised
        return None


def fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """The directory's entries (a rename into it, a new file) made durable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # not a local directory (an object store mount without directories)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """Every file and directory under `root` (and `root`) durable: before it is renamed into place."""
    root = Path(root)
    if root.is_file():
        fsync_file(root)
        return
    for directory, _, files in os.walk(root):
        for name in files:
            fsync_file(Path(directory) / name)
        fsync_dir(directory)


def write_synced(path: str | Path, text: str) -> None:
    """Write `text` to `path` and fsync it (the caller renames or publishes it after)."""
    with open(path, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def publish_json(path: str | Path, payload: dict) -> None:
    """`payload` as indented JSON at `path`: a temporary name, fsynced, renamed, the directory fsynced."""
    import json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    text = json.dumps(payload, indent=2)
    with whole_or_nothing(temporary, path, "a record", len(text.encode())):
        write_synced(temporary, text)
    os.replace(temporary, path)
    fsync_dir(path.parent)
