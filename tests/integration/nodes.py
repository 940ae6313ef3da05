"""Rehearsal nodes that share no disk: one mount namespace per node (root only).

Each node is a persistent mount namespace (``unshare --mount=<file> --propagation private``)
in which a directory of its own is bound over each of the node's disk paths (drape's live root,
which holds the shard cache). A process started through `command(node)` (``nsenter --mount=…``)
sees that node's disk and no other's; the network, the object store and the queue database are
all it shares. `kill` ends a node whole: every process in its namespace, then its disk.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

KILL_WAIT_S = 10.0  # the longest `Nodes.kill` waits for a node's processes to go


class NodeError(RuntimeError):
    pass


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise NodeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")


class Nodes:
    def __init__(self, root: Path, disk_paths: list[Path]):
        self.root, self.disk_paths = root, disk_paths
        self.handles = root / "namespaces"
        self.handles.mkdir(parents=True, exist_ok=True)
        # a persistent namespace is a bind mount on a file; its folder must not propagate mounts
        _run("mount", "--bind", str(self.handles), str(self.handles))
        _run("mount", "--make-private", str(self.handles))
        self.names: list[str] = []

    def disk(self, node: str) -> Path:
        return self.root / "disks" / node

    def add(self, node: str) -> None:
        handle = self.handles / node
        handle.touch()
        _run("unshare", f"--mount={handle}", "--propagation", "private", "true")
        self.names.append(node)
        for number, path in enumerate(self.disk_paths):
            own = self.disk(node) / str(number)
            own.mkdir(parents=True, exist_ok=True)
            path.mkdir(parents=True, exist_ok=True)  # the mount point, empty on the host
            _run(*self.command(node), "mount", "--bind", str(own), str(path))

    def command(self, node: str) -> list[str]:
        """The prefix that runs a program on `node` (`queue.node_commands`)."""
        return ["nsenter", f"--mount={self.handles / node}", "--"]

    def _inode(self, node: str) -> int:
        return os.stat(self.handles / node).st_ino

    def pids(self, node: str) -> list[int]:
        """Every process running on `node` (in its mount namespace)."""
        wanted, found = f"mnt:[{self._inode(node)}]", []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.readlink(entry / "ns" / "mnt") == wanted:
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def kill(self, node: str) -> list[int]:
        """The node goes: its processes SIGKILLed until none is left (`kill_processes`), then its disk
        wiped. Returns the pids killed."""
        killed = self.kill_processes(node)
        for number in range(len(self.disk_paths)):
            shutil.rmtree(self.disk(node) / str(number), ignore_errors=True)
        return killed

    def kill_processes(self, node: str) -> list[int]:
        """Every process on `node` SIGKILLed until none is left; its disk stays. Returns the pids
        killed. One pass over a snapshot is not enough: a process forked after the snapshot (a job
        step, a worker) outlived it (tests/integration/test_nodes.py), and one that exits on its own
        meanwhile is no error. A node half killed may be why Slurm once returned test_slurm.py's
        killed node to service 0.12 s after setting it DOWN (under load; not reproduced)."""
        killed: set[int] = set()
        deadline = time.monotonic() + KILL_WAIT_S
        while alive := self.pids(node):
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            killed.update(alive)
            if time.monotonic() > deadline:
                raise NodeError(f"node {node}: processes {sorted(alive)} still there {KILL_WAIT_S:g} s after SIGKILL")
            time.sleep(0.05)  # an exiting process leaves /proc (a zombie has no namespace)
        return sorted(killed)

    def close(self) -> None:
        for node in self.names:
            for pid in self.pids(node):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["umount", str(self.handles / node)], capture_output=True, timeout=30)
        subprocess.run(["umount", str(self.handles)], capture_output=True, timeout=30)
