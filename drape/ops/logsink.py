"""Log files on a full disk: a process keeps running, says so once, counts what it drops, and
writes again when space comes back (issue 68).

drape's processes log to files they did not open themselves: a queue job's stdout and stderr are
`<queue>/logs/<job>.log` (the local launcher), a flow run started by `drape serve`'s worker writes to
the worker's log, `drape queue dispatch` to wherever its service manager sends it. On a full disk
(ENOSPC, or a quota: EDQUOT, EFBIG) Python's `print` raises OSError from the write or, later, the
flush: a trainer or a flow crashed on its log line, and at exit the interpreter reports the failed
flush and exits 120. Every write of a log line then raised again (a traceback storm, itself
unwritable).

`tolerate_full_disks()` replaces `sys.stdout` and `sys.stderr`, where they are regular files, by
`FullDiskStream`s: each writes whole lines straight to its descriptor; a line that meets a full disk
is dropped and counted; the first drop writes one line on the other stream (when that is another
file) naming the path, the bytes needed and the bytes free; the first write after space is back
writes a closing line first: how many lines and bytes were dropped, and since when. Any other error
is raised as before.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import sys
import threading
import time
from datetime import UTC, datetime

FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
MAX_PENDING = 64 << 10  # a line longer than this is written in pieces


def _path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"file descriptor {fd}"


def _free(fd: int) -> int | None:
    try:
        found = os.fstatvfs(fd)
    except OSError:
        return None
    return found.f_bavail * found.f_frsize


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class FullDiskStream(io.TextIOBase):
    """A line-buffered text stream on `original`'s descriptor that drops and counts lines on a full disk."""

    def __init__(self, original, *, other=None):
        self.original, self.other = original, other
        self.fd = original.fileno()
        self._encoding = getattr(original, "encoding", None) or "utf-8"
        self.path = _path(self.fd)
        self.pending = bytearray()
        self.dropped_lines = self.dropped_bytes = 0
        self.full_since: float | None = None
        self.partial = False  # a write cut short left part of a line in the file
        self.need = ""  # what the first dropped write needed, and what was free
        self.lock = threading.RLock()

    # --- the text stream's surface -----------------------------------------------------------
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return False

    @property
    def buffer(self) -> _Bytes:
        """For code that writes bytes to `sys.stdout.buffer`: the same lines, the same counting."""
        return _Bytes(self)

    def write(self, text: str) -> int:
        self.write_bytes(text.encode(self._encoding, errors="backslashreplace"))
        return len(text)

    def write_bytes(self, data: bytes) -> None:
        with self.lock:
            self.pending += data
            cut = self.pending.rfind(b"\n") + 1 if len(self.pending) < MAX_PENDING else len(self.pending)
            if cut:
                payload, self.pending = bytes(self.pending[:cut]), self.pending[cut:]
                self._emit(payload)

    def flush(self) -> None:
        with self.lock:
            if self.pending:
                payload, self.pending = bytes(self.pending), bytearray()
                self._emit(payload)

    # --- writing, dropping, resuming -------------------------------------------------------
    def _emit(self, payload: bytes) -> None:
        if self.full_since is not None and not self._write_all(self._closing_line()):
            self._drop(payload)
            return
        if self.full_since is not None:
            self.dropped_lines = self.dropped_bytes = 0
            self.full_since = None
        if not self._write_all(payload):
            self._drop(payload)

    def _write_all(self, payload: bytes) -> bool:
        """Write all of `payload`; False when the disk is full (what was written stays: a partial line)."""
        view, wrote = memoryview(payload), False
        while view:
            try:
                written = os.write(self.fd, view)
            except OSError as error:
                if error.errno not in FULL:
                    raise
                written = 0
            if written <= 0:
                self.partial = self.partial or wrote
                return False
            wrote, view = True, view[written:]
        self.partial = not payload.endswith(b"\n")
        return True

    def _drop(self, payload: bytes) -> None:
        if self.full_since is None:
            self.full_since, free = time.time(), _free(self.fd)
            self.need = f"{len(payload)} bytes needed" + (f", {free} free" if free is not None else "")
            self._say(
                f"drape: {self.path} is full (ENOSPC): {self.need}; log lines are dropped and counted until space is freed\n"
            )
        self.dropped_lines += max(payload.count(b"\n"), 1)
        self.dropped_bytes += len(payload)

    def _closing_line(self) -> bytes:
        since = self.full_since or time.time()
        line = (
            f"drape: {self.dropped_lines} log line(s) ({self.dropped_bytes} bytes) dropped while {self.path} was full "
            f"(ENOSPC; {self.need}), from {_stamp(since)} to {_stamp(time.time())}\n"
        )
        return ("\n" if self.partial else "").encode() + line.encode()

    def _say(self, line: str) -> None:
        """One line on the other stream, when it writes to another file (else the closing line says it)."""
        other = self.other
        if other is None or _same_file(other.fd, self.fd):
            return
        try:
            os.write(other.fd, line.encode())
        except OSError:
            pass  # the other stream's disk is full too: its own closing line will say so


def _same_file(one: int, two: int) -> bool:
    try:
        first, second = os.fstat(one), os.fstat(two)
    except OSError:
        return True
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def _is_file(stream) -> bool:
    """A process's own stdout or stderr on a regular file (a test runner's capture, a subclass, is left alone)."""
    if type(stream) is not io.TextIOWrapper:
        return False
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False  # a terminal, a pipe, a test's capture: no full disk behind it


def tolerate_full_disks() -> None:
    """Make this process's stdout and stderr `FullDiskStream`s where they are regular files (idempotent)."""
    out, err = sys.stdout, sys.stderr
    if isinstance(out, FullDiskStream) or isinstance(err, FullDiskStream):
        return
    for stream in (out, err):
        if _is_file(stream):
            stream.flush()
    new_out = FullDiskStream(out) if _is_file(out) else None
    new_err = FullDiskStream(err) if _is_file(err) else None
    if new_out is not None:
        new_out.other = new_err or _Raw(err)
        sys.stdout = new_out
    if new_err is not None:
        new_err.other = new_out or _Raw(out)
        sys.stderr = new_err


class _Bytes:
    def __init__(self, stream: FullDiskStream):
        self.stream = stream

    def write(self, data: bytes) -> int:
        self.stream.write_bytes(bytes(data))
        return len(data)

    def flush(self) -> None:
        self.stream.flush()


class _Raw:
    """The other stream when it is no file (a terminal, a pipe): where the one-line notice goes."""

    def __init__(self, stream):
        try:
            self.fd = stream.fileno()
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            self.fd = 2
