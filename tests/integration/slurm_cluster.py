"""A real Slurm cluster for the tests: munged, slurmctld and a slurmd per node on this host (root only).

Debian's `slurm-wlm` and `munge` (`make services`), pointed at a config of the test's own through
`SLURM_CONF`: nothing in /etc is read or written, nothing is left running. Two slurmd on one host
are two nodes (``NodeName=n1 Port=…``, started with ``slurmd -N n1``), each offering two fake GPUs
as gres: device files made with ``mknod`` (`File=` lines in gres.conf), which is all Slurm checks.
With `nodes` (tests/integration/nodes.py) each slurmd starts inside its node's mount namespace, so
every job step it runs sees that node's disk and no other's.

Two shapes (`Shape`): `TWO_NODES` (slurm-00, slurm-01, two untyped GPUs each, one partition: the
engine's own tests), and `SITE`, a cluster shaped like a real site's (test_slurm_fleet.py): node
names as racks name them, typed gres of two GPU models in unequal counts, unequal CPUs and memory,
a feature per model, two partitions with time limits, memory a consumable (``CR_Core_Memory``) so
``--mem``/``--mem-per-gpu`` are enforced, and no slurmdbd (accounting off: ``sacct`` fails unless
``-c`` reads the jobcomp log). CPUs and memory are declared, not this host's (``config_overrides``).

`JobCompType=jobcomp/filetxt` makes ``sacct -c`` work without slurmdbd; `proctrack/linuxproc` and
`task/none` need no cgroups. `TIMING` holds the settings that decide how long a test waits on Slurm
(benchmarks/slurm_latency.py measures them against `FORMER_TIMING`): `SlurmdTimeout` short so a
killed node is noticed in seconds, `cred_expire` (also how long Slurm holds a requeued job: 120 s
by default), `KillWait` (SIGTERM to SIGKILL of a cancelled job's steps: 30 s by default), and
`sched_interval` (the scheduler's full pass).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Node:
    """One slurmd: its name, CPUs, memory (MiB), GPUs (gres type, "" untyped) and features."""

    name: str
    cpus: int = 2
    memory_mib: int = 2000
    gpu_type: str = ""
    gpus: int = 2
    features: tuple[str, ...] = ()

    @property
    def gres(self) -> str:
        return f"gpu:{self.gpu_type}:{self.gpus}" if self.gpu_type else f"gpu:{self.gpus}"


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    max_minutes: int | None = None  # None: INFINITE
    default: bool = False


@dataclass(frozen=True)
class Shape:
    nodes: tuple[Node, ...]
    partitions: tuple[Partition, ...]
    select: str = "CR_Core"
    extra: tuple[str, ...] = field(default=())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(node.name for node in self.nodes)


NODES = ("slurm-00", "slurm-01")
GPUS_PER_NODE = 2
TWO_NODES = Shape(tuple(Node(name) for name in NODES), (Partition("gpu", NODES, default=True),))
# a site's cluster: two A100 nodes of one rack (2 GPUs each, unequal CPUs and memory), one H100
# node of another (4 GPUs); partitions `a100` (default, 2 h) and `h100` (30 min)
SITE = Shape(
    (
        Node("gpu-a100-r07n03", cpus=6, memory_mib=6000, gpu_type="a100", gpus=2, features=("a100", "nvme")),
        Node("gpu-a100-r07n04", cpus=4, memory_mib=4000, gpu_type="a100", gpus=2, features=("a100",)),
        Node("gpu-h100-r12n01", cpus=8, memory_mib=8000, gpu_type="h100", gpus=4, features=("h100", "nvme")),
    ),
    (
        Partition("a100", ("gpu-a100-r07n03", "gpu-a100-r07n04"), max_minutes=120, default=True),
        Partition("h100", ("gpu-h100-r12n01",), max_minutes=30),
    ),
    select="CR_Core_Memory",
)


# slurm.conf's timing before the suite's time was cut (issue 63), for benchmarks/slurm_latency.py
FORMER_TIMING = {
    "cred_expire": "15",
    "SlurmdTimeout": "5",
    "SlurmctldTimeout": "5",
    "MessageTimeout": "5",
    "KillWait": "5",
    "SchedulerParameters": "sched_interval=1",
}
TIMING = {
    **FORMER_TIMING,
    # a step's launch takes well under a second here, even at a load of 12 on 2 cores; a requeued job
    # then waits 11 s, not 16 (benchmarks/slurm_latency.py). Measured and left: KillWait 3 (a cancel
    # still took 4.8 s), batch_sched_delay=0 (a start still 0.9 s); SlurmdTimeout under 5 would mark
    # a slurmd DOWN that a loaded machine kept from answering in time.
    "cred_expire": "10",
}


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


def _node_line(node: Node, port: int) -> str:
    features = f" Features={','.join(node.features)}" if node.features else ""
    return (
        f"NodeName={node.name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={node.cpus} Sockets=1 "
        f"CoresPerSocket={node.cpus} ThreadsPerCore=1 RealMemory={node.memory_mib} Gres={node.gres}{features} State=UNKNOWN"
    )


def _partition_line(partition: Partition) -> str:
    limit = partition.max_minutes if partition.max_minutes is not None else "INFINITE"
    default = "YES" if partition.default else "NO"
    return (
        f"PartitionName={partition.name} Nodes={','.join(partition.nodes)} Default={default} MaxTime={limit} "
        "State=UP OverSubscribe=NO"
    )


def _conf(root: Path, ports: list[int], shape: Shape, timing: dict[str, str]) -> str:
    nodes = "\n".join(_node_line(node, port) for node, port in zip(shape.nodes, ports[1:], strict=True))
    partitions = "\n".join(_partition_line(partition) for partition in shape.partitions)
    return f"""ClusterName=drape-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ports[0]}
AuthType=auth/munge
# cred_expire: also how long Slurm holds a requeued job (120 s by default; docs/slurm.md)
AuthInfo=socket={root / "munge.socket"},cred_expire={timing["cred_expire"]}
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
SelectTypeParameters={shape.select}
GresTypes=gpu
JobCompType=jobcomp/filetxt
JobCompLoc={root / "jobcomp.txt"}
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
MailProg=/bin/true
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout={timing["SlurmdTimeout"]}
SlurmctldTimeout={timing["SlurmctldTimeout"]}
MessageTimeout={timing["MessageTimeout"]}
InactiveLimit=0
KillWait={timing["KillWait"]}
MinJobAge=600
SchedulerType=sched/backfill
SchedulerParameters={timing["SchedulerParameters"]}
JobRequeue=1
{nodes}
{partitions}
"""


class SlurmCluster:
    """munged + slurmctld + a slurmd per node of `shape` under `root`; `env` is what a Slurm client
    needs (SLURM_CONF). `nodes` (tests/integration/nodes.py): each slurmd in its node's mount namespace
    (node-local disks); without, every node sees this host's disk (a shared disk)."""

    def __init__(self, root: Path, nodes=None, shape: Shape = TWO_NODES, timing: dict[str, str] | None = None):
        self.root, self.nodes, self.shape = root, nodes, shape
        self.timing = TIMING if timing is None else timing
        self.processes: dict[str, subprocess.Popen] = {}
        self.ports = _free_ports(1 + len(shape.nodes))
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        for folder in ("state", "spool", "dev", "munge"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(_conf(self.root, self.ports, self.shape, self.timing))
        gres = []
        for node in self.shape.nodes:
            (self.root / "spool" / node.name).mkdir(exist_ok=True)
            for index in range(node.gpus):
                device = self.root / "dev" / f"{node.name}-nvidia{index}"
                if not device.exists():
                    os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device, like /dev/null
                typed = f" Type={node.gpu_type}" if node.gpu_type else ""
                gres.append(f"NodeName={node.name} Name=gpu{typed} File={device}")
        (self.root / "gres.conf").write_text("\n".join(gres) + "\n")
        self._start_munge()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        for name in self.shape.names:
            self.start_node(name)
        self.wait_idle(self.shape.names, timeout)
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

    def kill_node(self, node: str, hang_s: float = 1.0) -> None:
        """`node` goes: its slurmd and every job step on it SIGKILLed (with `nodes`, its disk too).
        First it hangs for `hang_s` (its processes SIGSTOPped), as a dying machine stops answering,
        so what its slurmd had already sent reaches slurmctld while the node is still up. Killed at
        once, a reply still on its way can land after Slurm has set the node DOWN, and with
        `ReturnToService=2` Slurm returns the dead node to service (test_slurm_fleet.py's node
        test once saw that happen 36 ms after the DOWN)."""
        if self.nodes is not None:
            for pid in self.nodes.pids(node):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
        else:
            with contextlib.suppress(ProcessLookupError):
                self.freeze_node(node)
        time.sleep(hang_s)
        if self.nodes is not None:
            self.nodes.kill(node)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.processes[f"slurmd-{node}"].pid, signal.SIGKILL)
        self.processes[f"slurmd-{node}"].wait(timeout=10)

    def freeze_node(self, node: str, frozen: bool = True) -> None:
        """`node`'s slurmd stops answering (SIGSTOP to its process group), as a hung machine does, or
        answers again (SIGCONT)."""
        os.killpg(self.processes[f"slurmd-{node}"].pid, signal.SIGSTOP if frozen else signal.SIGCONT)

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
                exited = f"{dead} exited; " if dead else ""
                raise SlurmError(f"{exited}nodes {list(names)} not up within {timeout:.0f} s: {states}\n{self.logs()}")
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
