"""A real Slurm cluster for the tests: munged, slurmctld and two slurmd on this host (root only).

Debian's `slurm-wlm` and `munge` (`make services`), pointed at a config of the test's own through
`SLURM_CONF`: nothing in /etc is read or written, nothing is left running. Two slurmd on one host
are two nodes (``NodeName=n1 Port=…``, started with ``slurmd -N n1``), each offering two fake GPUs
as gres: device files made with ``mknod`` (`File=` lines in gres.conf), which is all Slurm checks.
With `nodes` (tests/integration/nodes.py) each slurmd starts inside its node's mount namespace, so
every job step it runs sees that node's disk and no other's.

`JobCompType=jobcomp/filetxt` makes ``sacct -c`` work without slurmdbd; `proctrack/linuxproc` and
`task/none` need no cgroups. `SlurmdTimeout` is short so a killed node is noticed in seconds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

NODES = ("slurm-00", "slurm-01")
GPUS_PER_NODE = 2


class SlurmError(RuntimeError):
    pass


def slurm_installed() -> str | None:
    """Why the Slurm tests cannot run here (None when they can)."""
    missing = [name for name in ("munged", "slurmctld", "slurmd", "sbatch", "sacct", "scontrol") if not shutil.which(name)]
    if missing:
        return f"{', '.join(missing)} not installed (`make services` installs slurm-wlm and munge)"
    if os.geteuid() != 0:
        return "the Slurm tests run slurmd, which needs root"
    return None


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _conf(root: Path, ports: list[int]) -> str:
    nodes = "\n".join(
        f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=2 Sockets=1 CoresPerSocket=2 "
        f"ThreadsPerCore=1 RealMemory=2000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
        for name, port in zip(NODES, ports[1:], strict=True)
    )
    return f"""ClusterName=drape-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ports[0]}
AuthType=auth/munge
# cred_expire: also how long Slurm holds a requeued job (120 s by default; docs/slurm.md)
AuthInfo=socket={root / "munge.socket"},cred_expire=15
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}/%n
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd-%n.pid"}
SlurmctldLogFile={root / "slurmctld.log"}
SlurmdLogFile={root / "slurmd-%n.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
JobCompType=jobcomp/filetxt
JobCompLoc={root / "jobcomp.txt"}
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
MailProg=/bin/true
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=5
SlurmctldTimeout=5
MessageTimeout=5
InactiveLimit=0
KillWait=5
MinJobAge=600
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
JobRequeue=1
{nodes}
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


class SlurmCluster:
    """munged + slurmctld + slurmd n1, n2 under `root`; `env` is what a Slurm client needs (SLURM_CONF)."""

    def __init__(self, root: Path, nodes=None):
        self.root, self.nodes = root, nodes
        self.processes: dict[str, subprocess.Popen] = {}
        self.ports = _free_ports(1 + len(NODES))
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        for folder in ("state", "spool", "dev", "munge"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(_conf(self.root, self.ports))
        gres = []
        for node in NODES:
            (self.root / "spool" / node).mkdir(exist_ok=True)
            for index in range(GPUS_PER_NODE):
                device = self.root / "dev" / f"{node}-nvidia{index}"
                if not device.exists():
                    os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device, like /dev/null
                gres.append(f"NodeName={node} Name=gpu File={device}")
        (self.root / "gres.conf").write_text("\n".join(gres) + "\n")
        self._start_munge()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        for node in NODES:
            self.start_node(node)
        self.wait_idle(NODES, timeout)
        return self

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.root.joinpath("munge").chmod(0o700)
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "--force",
                f"--socket={self.root / 'munge.socket'}",
                f"--key-file={key}",
                f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                f"--seed-file={self.root / 'munge' / 'seed'}",
                f"--log-file={self.root / 'munge' / 'munged.log'}",
            ],
        )
        deadline = time.monotonic() + 10
        while not (self.root / "munge.socket").exists():
            if time.monotonic() > deadline or self.processes["munged"].poll() is not None:
                raise SlurmError(f"munged did not start: {(self.root / 'munge' / 'munged.log').read_text(errors='replace')}")
            time.sleep(0.05)

    def _spawn(self, name: str, argv: list[str], prefix: list[str] | None = None) -> None:
        log = open(self.root / f"{name}.out", "ab")
        try:
            self.processes[name] = subprocess.Popen(
                [*(prefix or []), *argv], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()

    def start_node(self, node: str) -> None:
        """Start `node`'s slurmd, inside its mount namespace when there are `nodes`; a node that was
        killed comes back as a fresh machine: a new namespace over a new, empty disk."""
        if self.nodes is not None and f"slurmd-{node}" in self.processes:
            subprocess.run(["umount", str(self.nodes.handles / node)], capture_output=True, timeout=30)
            self.nodes.names.remove(node)
            self.nodes.add(node)
        prefix = self.nodes.command(node) if self.nodes is not None else []
        self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node], prefix)

    def kill_node(self, node: str) -> None:
        """`node` goes: its slurmd and every job step on it SIGKILLed (with `nodes`, its disk too)."""
        if self.nodes is not None:
            self.nodes.kill(node)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.processes[f"slurmd-{node}"].pid, signal.SIGKILL)
        self.processes[f"slurmd-{node}"].wait(timeout=10)

    def run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if check and done.returncode:
            raise SlurmError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def wait_idle(self, names, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if all(states.get(name, "").rstrip("*").lower() in ("idle", "mixed", "allocated") for name in names):
                return
            dead = [name for name, process in self.processes.items() if process.poll() is not None]
            if time.monotonic() > deadline or dead:
                raise SlurmError(
                    f"{dead} exited; " if dead else "" + f"nodes {names} not up within {timeout:.0f} s: {states}\n{self.logs()}"
                )
            time.sleep(0.2)

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}" for path in sorted(self.root.glob("*.log"))
        )

    def close(self) -> None:
        """Every daemon SIGTERMed, then SIGKILLed; each slurmd's job steps go with its process group."""
        for process in reversed(list(self.processes.values())):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
