"""A full disk under a log file (issue 68): the process logging to it goes on, says so once, counts
what it drops, and writes again when space is freed (drape/ops/logsink.py).

A process that logs as a queue job does (stdout to `<queue>/logs/<job>.log`, stderr to the same
file, as the local launcher starts it; or stderr elsewhere, as a service manager may) fills a 64 KiB
tmpfs in a mount namespace of its own (as tests/integration/test_full_disk.py), keeps printing,
and prints again after the tmpfs is grown. Before, its first print on the full disk raised OSError
(errno 28) and the process ended with a traceback it could not write.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FILL = 2000  # lines of ~100 bytes: three times the disk

# the logging process: drape's entry points call tolerate_full_disks() first; it prints what stdin asks
LOGGER = """
import os, sys
from drape.ops.logsink import tolerate_full_disks
if sys.argv[1] == "tolerant":
    tolerate_full_disks()
ack = os.fdopen(int(sys.argv[2]), "w")
for command in sys.stdin:
    phase, count = command.split()
    for number in range(int(count)):
        print(f"{phase} line {number:05d} " + "x" * 80)
    print(f"{phase} warning on stderr", file=sys.stderr)
    sys.stdout.flush()
    ack.write("ok\\n")
    ack.flush()
"""


@pytest.fixture(autouse=True)
def _mount_namespaces():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("the full-disk tests mount small filesystems in a mount namespace: they need root and unshare")


def logging_scenario(disk: str, mode: str, stderr_apart: bool) -> dict:
    """Inside the namespace: the logger fills the disk, the disk is grown, the logger logs again."""
    log = Path(disk) / "job.log"
    err_path = Path(disk).parent / "stderr.log"  # outside the small disk
    read_ack, write_ack = os.pipe()
    with open(log, "ab") as out, open(err_path if stderr_apart else log, "ab") as err:
        logger = subprocess.Popen(
            [sys.executable, "-c", LOGGER, mode, str(write_ack)],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            pass_fds=(write_ack,),
            text=True,
        )
    os.close(write_ack)
    acks = os.fdopen(read_ack)

    def phase(command: str) -> bool:
        logger.stdin.write(command + "\n")
        logger.stdin.flush()
        return acks.readline() == "ok\n"

    filled = phase(f"fill {FILL}")
    subprocess.run(["mount", "-o", "remount,size=1024k", disk], check=True)
    after = filled and phase("after 10")
    logger.stdin.close()
    code = logger.wait(timeout=60)
    stderr = err_path.read_text(errors="replace") if stderr_apart else ""
    return {"code": code, "filled": filled, "after": after, "log": log.read_text(errors="replace"), "stderr": stderr}


def _run(tmp_path: Path, mode: str, stderr_apart: bool) -> dict:
    return _on_a_full_disk(tmp_path / "disk", "logging_scenario", mode, stderr_apart)


def _on_a_full_disk(disk: Path, scenario: str, *args) -> dict:
    """`scenario(disk, *args)` of this module in a mount namespace of its own, `disk` a 64 KiB tmpfs there."""
    disk.mkdir()
    arguments = ", ".join(repr(value) for value in (str(disk), *args))
    code = (
        "import json, subprocess, sys; "
        f"subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', {str(disk)!r}], check=True); "
        f"from tests.integration.test_full_disk_logs import {scenario} as run; "
        f"print(json.dumps(run({arguments})))"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CLOSING = re.compile(
    r"drape: (\d+) log line\(s\) \((\d+) bytes\) dropped while (\S+) was full "
    r"\(ENOSPC; (\d+) bytes needed, (\d+) free\), from 20\S+ \S+ UTC to 20\S+ \S+ UTC\n"
)


@pytest.mark.parametrize("stderr_apart", [False, True], ids=["stderr-in-the-log", "stderr-apart"])
def test_a_full_disk_under_the_log_drops_and_counts_lines_and_logging_resumes(tmp_path, stderr_apart):
    seen = _run(tmp_path, "tolerant", stderr_apart)
    assert seen["code"] == 0 and seen["filled"] and seen["after"]  # the process went on
    log = seen["log"]
    assert "Traceback" not in log and "Errno 28" not in log
    closings = list(CLOSING.finditer(log))  # one per stream that dropped lines: stdout's, and stderr's when it shares the file
    assert len(closings) == (1 if stderr_apart else 2), log[-2000:]
    path = str(tmp_path / "disk" / "job.log")
    assert {found.group(3) for found in closings} == {path} and all(int(found.group(4)) > 0 for found in closings)
    dropped = sum(int(found.group(1)) for found in closings)
    whole = re.findall(r"^fill line \d{5} x{80}$", log[: closings[0].start()], re.M)
    warnings = 0 if stderr_apart else 1  # the fill phase's stderr line, written to the full file, is dropped too
    assert len(whole) + dropped == FILL + warnings  # every line is written whole or counted
    assert 0 < len(whole) < FILL
    after = log[closings[0].end() :]
    assert re.findall(r"^after line (\d{5}) ", after, re.M) == [f"{n:05d}" for n in range(10)]  # resumed, in order
    assert "after warning on stderr" in (seen["stderr"] if stderr_apart else after)
    if stderr_apart:  # one clear line on stderr, naming the path and the bytes needed
        notices = [line for line in seen["stderr"].splitlines() if "is full (ENOSPC)" in line]
        assert len(notices) == 1 and notices[0].startswith(f"drape: {path} is full (ENOSPC): "), seen["stderr"]
        assert re.search(r"\d+ bytes needed, \d+ free; log lines are dropped and counted until space is freed$", notices[0])


def test_before_a_full_log_disk_ended_the_process_with_errno_28(tmp_path):
    """What the tolerant streams replace: the same logger without them dies on its first full write."""
    seen = _run(tmp_path, "plain", stderr_apart=True)
    assert seen["code"] != 0 and not seen["filled"]
    assert "No space left on device" in seen["stderr"]


def entry_point_scenario(disk: str) -> dict:
    """Inside the namespace: the disk filled to the last byte, a stage job's entry point logs to it."""
    filler = os.open(Path(disk) / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(filler, b"\0" * 512):
            pass
    except OSError:
        pass  # full to the last block
    finally:
        os.close(filler)
    log, err_path = Path(disk) / "job.log", Path(disk).parent / "stderr.log"
    with open(log, "ab") as out, open(err_path, "ab") as err:
        done = subprocess.run([sys.executable, "-m", "drape.train", "--help"], stdout=out, stderr=err, timeout=120)
    return {"code": done.returncode, "stderr": err_path.read_text(errors="replace")}


def test_a_stage_jobs_entry_point_on_a_full_log_disk_ends_0_with_one_line_on_stderr(tmp_path):
    disk = tmp_path / "disk"
    seen = _on_a_full_disk(disk, "entry_point_scenario")
    assert seen["code"] == 0, seen["stderr"]  # before: exit 120, "Exception ignored ... No space left on device"
    assert seen["stderr"].startswith(f"drape: {disk / 'job.log'} is full (ENOSPC): "), seen["stderr"]
    assert seen["stderr"].count("\n") == 1 and "Traceback" not in seen["stderr"]
