"""One live trainer per stage directory: a second one refuses to start instead of writing over it.

The trainer's main rank holds an exclusive `flock` on the stage directory's ``.trainer.lock`` for
as long as it trains. The kernel drops the lock with the process, however it ends (SIGKILL, OOM,
a lost node's reboot), so a dead trainer never blocks its retry, and a live one, however it was
started (a restarted dispatcher relaunching a job it lost track of, an operator by hand), always
blocks a second. The holder writes who it is into the file, for the second one's error.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from drape.layout import StagePaths


class StageBusy(RuntimeError):
    """Another live trainer holds the stage directory."""


def _acquire(path: Path) -> int:
    """An open descriptor of `path` holding its exclusive lock (the file as it is at `path` now)."""
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 512, 0).decode(errors="replace").strip() or "unknown"
            os.close(descriptor)
            raise StageBusy(
                f"stage directory {path.parent} is held by another live trainer ({holder}); "
                "two trainers would write one stage: stop that one, or wait for it to end"
            ) from None
        try:
            same = os.stat(path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file its last holder unlinked as we opened it
            return descriptor
        os.close(descriptor)


@contextmanager
def stage_lock(stage_dir: str | Path, *, hold: bool = True) -> Iterator[None]:
    """Hold `stage_dir` for this trainer (`hold`: the main rank; the others pass through)."""
    if not hold:
        yield
        return
    path = StagePaths(Path(stage_dir)).trainer_lock
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = _acquire(path)
    try:
        os.ftruncate(descriptor, 0)
        holder = f"host {socket.gethostname()}, pid {os.getpid()}, since {time.strftime('%Y-%m-%dT%H:%M:%S%z')}"
        os.pwrite(descriptor, holder.encode(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)  # while still held: a waiter that opened it re-checks the inode
        os.close(descriptor)
