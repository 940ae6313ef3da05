"""drape/ops/logsink.py on /dev/full (every write: ENOSPC), then on a file in its place (space freed)."""

from __future__ import annotations

import io
import os
import re
import sys

import pytest

from drape.ops import logsink
from drape.ops.logsink import FullDiskStream


def _stream_on_dev_full(tmp_path):
    full = open("/dev/full", "w")  # noqa: SIM115 - the stream takes its descriptor
    notices = open(tmp_path / "stderr.log", "w")  # noqa: SIM115
    stream = FullDiskStream(full, other=FullDiskStream(notices))
    return stream, full, notices


def test_lines_on_a_full_disk_are_dropped_counted_and_said_once_then_logging_resumes(tmp_path):
    stream, full, notices = _stream_on_dev_full(tmp_path)
    for number in range(5):
        print(f"line {number}", file=stream)  # no OSError: dropped
    stream.write("a partial line")
    stream.flush()
    said = (tmp_path / "stderr.log").read_text()
    assert said.count("\n") == 1 and said.startswith("drape: /dev/full is full (ENOSPC): 7 bytes needed")
    assert stream.dropped_lines == 6 and stream.dropped_bytes == 5 * 7 + len("a partial line")
    freed = open(tmp_path / "job.log", "w")  # noqa: SIM115 - space freed: the same descriptor now has room
    os.dup2(freed.fileno(), full.fileno())
    print("after", file=stream)
    stream.buffer.write(b"bytes too\n")
    log = (tmp_path / "job.log").read_text()
    assert re.fullmatch(
        r"drape: 6 log line\(s\) \(49 bytes\) dropped while /dev/full was full \(ENOSPC; 7 bytes needed, \d+ free\), "
        r"from 20\S+ \S+ UTC to 20\S+ \S+ UTC\nafter\nbytes too\n",
        log,
    ), log
    assert stream.full_since is None and stream.dropped_lines == 0
    for handle in (full, notices, freed):
        handle.close()


def test_other_write_errors_are_raised_as_before(tmp_path):
    handle = open(tmp_path / "log", "w")  # noqa: SIM115
    stream = FullDiskStream(handle)
    handle.close()  # its descriptor is gone: EBADF is not a full disk
    with pytest.raises(OSError, match="Bad file descriptor"):
        print("line", file=stream)


def test_only_a_processs_own_streams_on_regular_files_are_replaced(tmp_path, monkeypatch):
    own = io.TextIOWrapper(open(tmp_path / "out.log", "wb"))  # noqa: SIM115 - what a process's stdout on a file is
    monkeypatch.setattr(sys, "stdout", own)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a capture: no descriptor, left alone
    logsink.tolerate_full_disks()
    assert isinstance(sys.stdout, FullDiskStream) and isinstance(sys.stderr, io.StringIO)
    replaced = sys.stdout
    logsink.tolerate_full_disks()  # idempotent
    assert sys.stdout is replaced
    print("through the stream", file=sys.stdout)
    assert (tmp_path / "out.log").read_text() == "through the stream\n"
    own.close()
