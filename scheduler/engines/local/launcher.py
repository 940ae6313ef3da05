"""The local engine: a claimed job as a process group on this machine (or, through
`queue.node_commands`, on the node the queue chose: ``ssh node-a``, or ``nsenter`` into a
rehearsal node's mount namespace).

The process gets `CUDA_VISIBLE_DEVICES` set to the assigned devices (empty for the CPU slot),
`DRAPE_NODE` (the node the queue chose), `DRAPE_JOB_ID`, and `DRAPE_JOB_RESULT`, a JSON file where
the job may write its measured peak memory; stdout and stderr go to `<log dir>/<job id>.log`, the
exit status to `<log dir>/<job id>.exit`. A torchrun job (`labels.launch`) on more than one GPU
runs its ranks under ``python -m torch.distributed.run --standalone --nproc-per-node=N`` (gloo on
a machine without CUDA). `NullLauncher` starts nothing (benchmarks, placement tests). The shape
every engine shares is `scheduler/engines/__init__.py`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from scheduler.engines import Outcome, device_indices, exit_message, is_python, job_environment, module_args
from scheduler.engines.reasons import failure_message, read_tail
from scheduler.policy import GpuState


def torchrun_command(command: list[str], nproc: int, *, local: bool = False) -> list[str]:
    """`command` as `nproc` ranks on one node under torchrun (`--standalone`: a rendezvous on a free
    local port, so jobs on one machine never collide); `local`: through the command's own
    interpreter (`python -m torch.distributed.run`), which needs no `torchrun` on PATH."""
    if nproc <= 1:
        return command
    runner = [command[0] if is_python(command[0]) else sys.executable, "-m", "torch.distributed.run"] if local else ["torchrun"]
    program = module_args(command) if is_python(command[0]) else ["--no-python", *command]
    return [*runner, "--standalone", f"--nproc-per-node={nproc}", *program]


# The job's exit status, written by the shell the launcher starts it in: a dispatcher that did not
# start the process (it restarted) cannot wait for it, so it reads the status from this file.
_EXIT_SCRIPT = (
    'status=0; "$@" || status=$?; '
    'printf "%s\\n" "$status" > "$DRAPE_JOB_EXIT.tmp" && mv -f "$DRAPE_JOB_EXIT.tmp" "$DRAPE_JOB_EXIT"; exit "$status"'
)


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), None when it is
    gone or a zombie: with the pid it names one process, never a later one that reused the pid."""
    fields = _stat_fields(pid)
    return None if fields is None or fields[0] in ("Z", "X") else int(fields[19])


def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state first), None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


class LocalLauncher:
    """Jobs as process groups on this machine; `handle` is ``pid:<pid>:<start ticks>:<host>``, so a
    restarted dispatcher on this host can tell the job's process from any other and adopt it."""

    def __init__(self, log_dir: str | Path, passed: Iterable[str] = (), node_commands: dict[str, list[str]] | None = None):
        self.log_dir = Path(log_dir)
        self.passed = tuple(passed)
        self.node_commands = node_commands or {}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: dict[str, subprocess.Popen] = {}
        self.host = socket.gethostname()

    def result_path(self, job_id: str) -> Path:
        return self.log_dir / f"{job_id}.result.json"

    def log_path(self, job_id: str) -> Path:
        return self.log_dir / f"{job_id}.log"

    def exit_path(self, job_id: str) -> Path:
        return self.log_dir / f"{job_id}.exit"

    def launch(self, job: dict, gpus: list[GpuState]) -> str:
        env = {
            **job_environment(self.passed),
            **json.loads(job["env"] or "{}"),
            "CUDA_VISIBLE_DEVICES": device_indices(gpus),
            "DRAPE_JOB_ID": job["id"],
            "DRAPE_JOB_RESULT": str(self.result_path(job["id"])),
            "DRAPE_JOB_EXIT": str(self.exit_path(job["id"])),
            "DRAPE_NODE": gpus[0].node if gpus else self.host,
        }
        command = json.loads(job["command"])
        if json.loads(job.get("labels") or "{}").get("launch") == "torchrun":
            command = torchrun_command(command, len(gpus), local=True)
        # on another node: its prefix runs the job there; the shell that records the exit status stays here
        command = [*self.node_commands.get(gpus[0].node if gpus else "", []), *command]
        self.exit_path(job["id"]).unlink(missing_ok=True)
        log = open(self.log_path(job["id"]), "ab")
        try:
            child = subprocess.Popen(
                ["/bin/sh", "-c", _EXIT_SCRIPT, "drape-job", *command],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        self.children[job["id"]] = child
        return f"pid:{child.pid}:{_start_ticks(child.pid)}:{self.host}"

    def _parse(self, handle: str | None) -> tuple[int, int] | None:
        """(pid, start ticks) of a handle of this host, else None."""
        parts = (handle or "").split(":")
        if len(parts) != 4 or parts[0] != "pid" or parts[3] != self.host or not parts[1].isdigit():
            return None
        return int(parts[1]), int(parts[2]) if parts[2].isdigit() else -1

    def sees(self, handle: str | None) -> bool:
        """Whether the job's process is (or was) on this host: a restarted dispatcher adopts it."""
        return self._parse(handle) is not None

    def find_job(self, job_id: str) -> str | None:
        """The handle of the job's process on this host, found by its environment (`DRAPE_JOB_ID`, on
        the session leader the launcher started): for a job whose dispatcher died after starting it
        and before recording its handle, which would otherwise be requeued and run twice at once."""
        wanted = f"DRAPE_JOB_ID={job_id}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            fields = _stat_fields(entry.name)
            if fields is None or fields[3] != entry.name:  # gone, or not a session leader
                continue
            try:
                found = wanted in (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if found and (ticks := _start_ticks(int(entry.name))) is not None:
                return f"pid:{entry.name}:{ticks}:{self.host}"
        return None

    def poll(self, job_id: str, handle: str | None = None) -> Outcome | None:
        child = self.children.get(job_id)
        if child is not None:
            code = child.poll()
            if code is None:
                return None
            self.children.pop(job_id)
            return self._outcome(job_id, code)
        parsed = self._parse(handle)
        if parsed is None:
            return Outcome(-1, f"the job's process ({handle}) is not on this host ({self.host})")
        pid, ticks = parsed
        if _start_ticks(pid) == ticks:
            return None  # adopted and still running
        try:
            code = int(self.exit_path(job_id).read_text())
        except (OSError, ValueError):
            return Outcome(-1, f"the job's process ({handle}) ended without an exit status (killed with its process group?)")
        return self._outcome(job_id, code)

    def _outcome(self, job_id: str, code: int) -> Outcome:
        peak = None
        result = self.result_path(job_id)
        if result.is_file():
            try:
                peak = json.loads(result.read_text()).get("peak_memory_gib")
            except ValueError:
                peak = None
        if not code:
            return Outcome(code, exit_message(code), peak)
        return Outcome(code, failure_message(exit_message(code), read_tail(self.log_path(job_id))), peak)

    def cancel(self, job_id: str, handle: str | None = None, grace_s: float = 10.0) -> None:
        """Stop the job's process group: SIGTERM (a stage job saves what it can), then SIGKILL after
        `grace_s`, so its GPUs are free when this returns (a preempting job starts on them next)."""
        child = self.children.pop(job_id, None)
        parsed = self._parse(handle)
        pid = child.pid if child is not None else parsed[0] if parsed and _start_ticks(parsed[0]) == parsed[1] else None
        if pid is None or (child is not None and child.poll() is not None):
            return

        def alive() -> bool:  # any process of the group: the shell ends on SIGTERM, a hung trainer in it does not
            if child is not None:
                child.poll()  # the shell reaped, so only living members count
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return False
            return True

        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + grace_s
            while alive() and time.monotonic() < deadline:
                time.sleep(0.05)


class NullLauncher:
    """Starts nothing, and every job it "launched" runs on: for benchmarks and tests that read
    where the policy placed jobs, or time a dispatch cycle over a full queue."""

    def launch(self, job: dict, gpus: list[GpuState]) -> str:
        return "null"

    def sees(self, handle: str | None) -> bool:
        return True

    def poll(self, job_id: str, handle: str | None = None) -> Outcome | None:
        return None

    def cancel(self, job_id: str, handle: str | None = None) -> None:
        pass


def build(config, log_dir: Path) -> LocalLauncher:
    return LocalLauncher(log_dir, config.queue.job_environment, config.queue.node_commands)
