"""Durability before a rename publishes: the bytes and the directory entry reach the disk first.

A rename is atomic but not durable: after a power loss the new name can point at a file whose
data never left the page cache. Whatever drape publishes by rename (file:// objects, checkpoints,
baselines, run records) is fsynced first, and its directory after, before the live copy it
replaces may be freed.
"""

from __future__ import annotations

import os
from pathlib import Path


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
    write_synced(temporary, json.dumps(payload, indent=2))
    os.replace(temporary, path)
    fsync_dir(path.parent)
