"""`drape serve` / `make serve`: a local Prefect server, drape's work pools and deployments, and a
process worker for the `local` pool, the way operators run drape.

Everything goes through the `prefect` command (no prefect import here): `prefect server start`,
`prefect work-pool create`, `prefect deploy --all --prefect-file deployments/prefect.yaml`,
`prefect worker start`. A process worker needs a second signal to stop; `stop` sends both.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PREFECT_FILE = REPO / "deployments" / "prefect.yaml"
GPU_TEMPLATE = REPO / "deployments" / "gpu-k8s-job-template.json"


class ServeError(RuntimeError):
    """A step of bringing up the local stack that failed; says which and shows its output."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _prefect() -> str:
    found = shutil.which("prefect", path=str(Path(sys.executable).parent)) or shutil.which("prefect")
    if not found:
        raise ServeError("the `prefect` command is not installed in this environment (pip install -e .)")
    return found


@dataclass
class Stack:
    home: Path
    port: int
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_API_URL": self.api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DRAPE_REPO": str(REPO),
            "PYTHONPATH": str(REPO),
            "PREFECT_UI_URL": self.ui_url,
        }

    def prefect(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        """Run `prefect ARGS` against this stack's API from the repository root."""
        result = subprocess.run([_prefect(), *args], cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise ServeError(
                f"`prefect {' '.join(args)}` exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        return result

    def start_server(self, timeout: float = 120) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        log = open(self.home / "server.log", "ab")
        self.processes["server"] = subprocess.Popen(
            [_prefect(), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=REPO,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                if json.loads(urllib.request.urlopen(f"{self.api_url}/health", timeout=2).read()) is True:
                    return
            except OSError:
                pass
            if self.processes["server"].poll() is not None or time.monotonic() > deadline:
                tail = (self.home / "server.log").read_text(errors="replace")[-3000:]
                raise ServeError(f"the Prefect server did not come up on {self.ui_url}:\n{tail}")
            time.sleep(0.5)

    def create_pools(self, timeout: float = 300) -> list[str]:
        """`local` and `slurm-login` (process), `gpu-k8s` (kubernetes, with drape's base job template),
        created at once (each `prefect` command is an interpreter start); returns notes."""
        pools = {
            "local": ["--type", "process"],
            "slurm-login": ["--type", "process"],
            "gpu-k8s": ["--type", "kubernetes", "--base-job-template", str(GPU_TEMPLATE)],
        }
        running = {
            name: subprocess.Popen(
                [_prefect(), "work-pool", "create", name, *options, "--overwrite"],
                cwd=REPO,
                env=self.env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for name, options in pools.items()
        }
        deadline, said = time.monotonic() + timeout, {}
        try:
            for name, process in running.items():
                said[name] = process.communicate(timeout=max(deadline - time.monotonic(), 1))[0]
        except subprocess.TimeoutExpired:
            late = [name for name, process in running.items() if process.poll() is None]
            raise ServeError(f"`prefect work-pool create` did not finish within {timeout:.0f} s: {', '.join(late)}") from None
        finally:
            for process in running.values():
                if process.poll() is None:
                    process.kill()
                    process.wait()
        for name in ("local", "slurm-login"):
            if running[name].returncode != 0:
                raise ServeError(f"`prefect work-pool create {name}` exited {running[name].returncode}:\n{said[name][-3000:]}")
        if running["gpu-k8s"].returncode != 0:
            return [f"gpu-k8s pool not created: {said['gpu-k8s'].strip()[-300:]}"]
        return []

    def deploy(self) -> str:
        return self.prefect("deploy", "--all", "--prefect-file", str(PREFECT_FILE)).stdout

    def start_worker(self, pool: str = "local", prefix: list[str] | None = None) -> None:
        """A process worker for `pool`; `prefix` runs it elsewhere (on a rehearsal node: nsenter into its namespace)."""
        log = open(self.home / f"worker-{pool}.log", "ab")
        self.processes[f"worker-{pool}"] = subprocess.Popen(
            [*(prefix or []), _prefect(), "worker", "start", "--pool", pool, "--type", "process"],
            cwd=REPO,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self, grace: float = 20) -> None:
        """Stop workers and server within `grace` seconds in all: SIGINT (a process worker needs a
        second one), then SIGKILL to each process group, which also ends what they started."""
        deadline = time.monotonic() + grace
        ordered = sorted(self.processes.values(), key=lambda p: p is self.processes.get("server"))
        for share in (0.5, 0.75):  # first and second SIGINT, each with its share of the grace
            for process in ordered:
                if process.poll() is None:
                    _signal_group(process.pid, signal.SIGINT)
            _wait_all(ordered, time.monotonic() + (deadline - time.monotonic()) * share)
        for process in ordered:  # the leader may be gone while what it started is not: the whole group
            _signal_group(process.pid, signal.SIGKILL)
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                pass
        self.processes.clear()


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def _wait_all(processes: list[subprocess.Popen], until: float) -> None:
    while any(process.poll() is None for process in processes) and time.monotonic() < until:
        time.sleep(0.1)


def serve(home: Path, port: int | None = None) -> Stack:
    """Bring up server, pools, deployments and a `local` worker; returns the running stack."""
    stack = Stack(Path(home), port or 4200)
    try:  # a signal while the server comes up must stop it too
        stack.start_server()
        for note in stack.create_pools():
            print(note)
        stack.deploy()
        stack.start_worker("local")
    except BaseException:
        stack.stop()
        raise
    return stack
