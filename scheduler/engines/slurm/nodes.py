"""The fleet as Slurm sees it (`queue.fleet: slurm`): nodes read from ``scontrol show node -o`` and
partitions from ``sinfo``, parsed as untrusted input, into the queue's GPUs.

Slurm is then the one place the fleet is written (slurm.conf and gres.conf), and drape's queue
places on exactly the nodes, GPU models and counts Slurm will give. Each node line gives its name,
typed gres (``gpu:a100:2``, ``gpu:h100:4(S:0-1)``, ``gpu:2``), CPUs, memory, features,
partitions and state; a GPU's memory comes from `queue.slurm.gpu_memory_gib` (gres type → GiB),
since Slurm does not know it, and a type the map lacks is an error naming the node and the type.

A node takes new jobs only in a base state of IDLE, MIXED or ALLOCATED with no flag that keeps
jobs off it (DRAIN, DOWN, MAINT, NOT_RESPONDING's ``*``, a power or reboot flag …). A drained or
down node's GPUs stay in the fleet (the same uuids, so the queue's ledger and its planner keep
their running jobs, and a job that only such a node could hold waits rather than being refused as
unplaceable) but are seen full, as DCGM would report a busy GPU (all memory used, 100 %): the queue
places nothing new there until Slurm takes the node back.

GPUs other jobs hold: Slurm may run jobs drape did not start on the same nodes (a shared
partition, other teams, interactive sessions). ``scontrol show node -o -d`` adds each node's
``GresUsed`` (``gpu:a100:1(IDX:0)``, ``gpu:1`` untyped), the GPUs Slurm has allocated there, drape's
jobs among them. Given the GPUs drape's own running jobs hold (`fleet_gpus`'s ``ours``), the rest of
each type's count is held by someone else, and that many of the GPUs drape has free there are seen
full, as a drained node's are: the queue does not place a job Slurm would only keep pending. Which
of them is a guess (drape's uuid ``<node>/gpu<i>`` is not Slurm's index), the count is not.

Untrusted: a name is a Slurm name (letters, digits, ``_ . + -``, bounded length), every number is
whole and bounded (`MAX_*`), a key appears once (the first wins: a node's free-text Reason comes
after the fields read here and cannot shadow them), and a refusal names the node and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from drape.config import names
from scheduler.policy import GpuState
from scheduler.queue.inventory import MAX_GPU_MEMORY_GIB, MAX_GPUS_PER_NODE, MAX_NODES_PER_GROUP

MAX_CPUS_PER_NODE = 16_384
MAX_MEMORY_MIB = 64 * 2**20  # 64 TiB: beyond any node
MAX_LINE = 16_384
UNTYPED = "gpu"  # the gpu_memory_gib key of GPUs whose gres names no type (gpu:4)
_NAME = names.SLURM_NAME  # partitions, features, gres types (drape/config/names.py)
USABLE_BASES = {"IDLE", "MIXED", "ALLOCATED"}
BLOCKING_FLAGS = {
    "DRAIN", "DRAINING", "DRAINED", "DOWN", "FAIL", "FAILING", "MAINT", "NOT_RESPONDING", "NO_RESPOND", "RESERVED",
    "POWERED_DOWN", "POWER_DOWN", "POWERING_DOWN", "POWERING_UP", "POWER_UP", "REBOOT_REQUESTED", "REBOOT_ISSUED",
    "INVALID_REG", "FUTURE", "UNKNOWN", "INVAL",
}  # fmt: skip
_STATE_SYMBOLS = "*~#%!$@^-"  # sinfo's suffixes: not responding, powered down, powering up/down, maintenance, reboot


class SlurmParseError(ValueError):
    """Slurm output drape cannot trust: names the node (or line) and the field."""


@dataclass(frozen=True)
class SlurmNode:
    name: str
    cpus: int
    memory_mib: int  # what jobs may use: RealMemory less MemSpecLimit
    gpus: tuple[tuple[str, int], ...]  # (gres type, "gpu" when untyped; count)
    features: tuple[str, ...]
    partitions: tuple[str, ...]
    state: str
    address: str = ""
    used: tuple[tuple[str, int], ...] = ()  # GPUs Slurm has allocated, per gres type (GresUsed; () unread)

    @property
    def num_gpus(self) -> int:
        return sum(count for _, count in self.gpus)

    @property
    def is_usable(self) -> bool:
        """Whether Slurm would start a new job here (see the module docstring)."""
        return is_usable_state(self.state)


def is_usable_state(state: str) -> bool:
    """``IDLE``, ``MIXED``, ``ALLOCATED+COMPLETING``: yes; ``IDLE+DRAIN``, ``DOWN*``, ``MIXED~``: no."""
    base, *flags = state.upper().split("+")
    if not base or base.rstrip(_STATE_SYMBOLS) != base:
        return False
    return base in USABLE_BASES and not BLOCKING_FLAGS.intersection(flags)


def fields(line: str) -> dict[str, str]:
    """``Key=value Key=value …`` → {Key: value}, the first of each key (values read here hold no spaces)."""
    parsed: dict[str, str] = {}
    for part in line.split():
        key, equals, value = part.partition("=")
        if equals and key not in parsed:
            parsed[key] = value
    return parsed


def _whole(shown: dict[str, str], key: str, limit: int, at: str, default: str | None = None) -> int:
    text = shown.get(key, default)
    if text is None:
        raise SlurmParseError(f"{at}: no {key}")
    if not text.isdigit() or int(text) > limit:
        raise SlurmParseError(f"{at}: {key}={text[:40]!r} is not a whole number in [0, {limit}]")
    return int(text)


def _names(text: str, at: str, key: str) -> tuple[str, ...]:
    if text in ("", "(null)", "N/A"):
        return ()
    names = tuple(text.split(","))
    bad = [name for name in names if not _NAME.fullmatch(name)]
    if bad:
        raise SlurmParseError(f"{at}: {key} holds {bad[0][:40]!r}, not a Slurm name")
    return names


def parse_gres(text: str, at: str = "gres", least: int = 1) -> tuple[tuple[str, int], ...]:
    """GPUs of a gres string: ``gpu:h100:4(S:0-1),gpu:a100:2`` → (("h100", 4), ("a100", 2)); other
    gres (``mps:100``) are skipped; ``(null)`` and empty: none. `least` 0: counts of none allowed
    (``GresUsed``'s ``gpu:h100:0(IDX:N/A)``; an untyped gres there may print its type as ``(null)``)."""
    gpus: list[tuple[str, int]] = []
    for entry in re.split(r",(?![^(]*\))", text or ""):
        entry = re.sub(r"\([^()]*\)$", "", entry.strip())  # the socket binding: (S:0-1), (IDX:0-3)
        if entry in ("", "(null)"):
            continue
        parts = [part for part in entry.split(":") if part != "no_consume"]
        if parts[0] != "gpu":
            continue
        kind, count = (UNTYPED, parts[1]) if len(parts) == 2 else (parts[1], parts[2]) if len(parts) == 3 else ("", "")
        kind = UNTYPED if kind == "(null)" else kind
        if not count.isdigit() or not _NAME.fullmatch(kind) or not least <= int(count) <= MAX_GPUS_PER_NODE:
            raise SlurmParseError(f"{at}: gres {entry[:60]!r}: expected gpu[:<type>]:<{least}..{MAX_GPUS_PER_NODE}>")
        gpus.append((kind, int(count)))
    return tuple(gpus)


def parse_node(line: str) -> SlurmNode:
    """One ``scontrol show node -o`` line (see the module docstring)."""
    if len(line) > MAX_LINE:
        raise SlurmParseError(f"a node line of {len(line)} characters (at most {MAX_LINE})")
    shown = fields(line)
    name = shown.get("NodeName", "")
    if not names.NODE_NAME.fullmatch(name):  # the grammar the fleet file and the launcher hold node names to
        raise SlurmParseError(f"scontrol show node: NodeName={name[:40]!r} is not a node name drape can place on")
    at = f"Slurm node {name}"
    cpus = _whole(shown, "CPUEfctv" if "CPUEfctv" in shown else "CPUTot", MAX_CPUS_PER_NODE, at)
    memory = _whole(shown, "RealMemory", MAX_MEMORY_MIB, at) - _whole(shown, "MemSpecLimit", MAX_MEMORY_MIB, at, "0")
    state = shown.get("State", "")
    if not re.fullmatch(r"[A-Z_]+[*~#%!$@^-]?(\+[A-Z_]+)*", state):
        raise SlurmParseError(f"{at}: State={state[:40]!r} is not a Slurm node state")
    address = shown.get("NodeAddr", "")
    return SlurmNode(
        name,
        max(cpus, 0),
        max(memory, 0),
        parse_gres(shown.get("Gres", ""), at),
        _names(shown.get("AvailableFeatures", ""), at, "AvailableFeatures"),
        _names(shown.get("Partitions", ""), at, "Partitions"),
        state,
        address if names.NODE_NAME.fullmatch(address) else "",
        parse_gres(shown.get("GresUsed", ""), f"{at}: GresUsed", least=0),
    )


def parse_nodes(text: str) -> list[SlurmNode]:
    """Every node of ``scontrol show node -o`` (one per line; blank lines skipped), names unique."""
    nodes = [parse_node(line) for line in text.splitlines() if line.strip()]
    if len(nodes) > MAX_NODES_PER_GROUP:
        raise SlurmParseError(f"scontrol show node: {len(nodes)} nodes (at most {MAX_NODES_PER_GROUP})")
    names = [node.name for node in nodes]
    if len(set(names)) != len(names):
        raise SlurmParseError(f"scontrol show node: a node listed twice ({sorted(n for n in names if names.count(n) > 1)[0]})")
    return nodes


def minutes(limit: str) -> int | None:
    """A Slurm time limit (``30:00``, ``2:00:00``, ``1-12:00:00``, ``45``) in minutes; None: none (``infinite``)."""
    text = limit.strip().lower()
    if text in ("infinite", "unlimited", "n/a", "none"):
        return None
    match = re.fullmatch(r"(?:(\d{1,4})-)?(\d{1,6})(?::(\d{1,2}))?(?::(\d{1,2}))?", text)
    if not match:
        raise SlurmParseError(f"a partition time limit {limit[:40]!r}: expected [days-]hours:minutes:seconds or INFINITE")
    days, first, second, third = match.groups()
    if third is not None:  # h:m:s
        total = int(first) * 60 + int(second) + (int(third) > 0)
    elif second is not None:  # m:s, or d-h:m
        total = int(first) * 60 + int(second) if days else int(first) + (int(second) > 0)
    else:  # minutes, or d-h
        total = int(first) * 60 if days else int(first)
    return total + int(days or 0) * 24 * 60


def parse_partitions(text: str) -> dict[str, int | None]:
    """``sinfo -h -o '%R|%l'`` → {partition: time limit in minutes, None: no limit}."""
    limits: dict[str, int | None] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, limit = line.strip().partition("|")
        if not _NAME.fullmatch(name):
            raise SlurmParseError(f"sinfo: partition {name[:40]!r} is not a Slurm name")
        limits[name] = minutes(limit)
    return limits


def fleet_gpus(
    nodes: list[SlurmNode], memory_gib: dict[str, float], model_names: dict[str, str], ours: set[str] | None = None
) -> list[GpuState]:
    """The GPUs of `nodes` (an unusable node's seen full): uuid ``<node>/gpu<i>``, model the fleet's name of the gres type
    (`model_names`: type → model, else the type), memory from `memory_gib` (type → GiB). `ours`: the GPUs drape's
    running jobs hold; then as many more of each node's GPUs as Slurm has allocated beyond them are seen full
    (`foreign`; None: Slurm's allocations are not looked at)."""
    gpus: list[GpuState] = []
    for node in nodes:
        index, of_kind = 0, dict[str, list[GpuState]]()
        for kind, count in node.gpus:
            if kind not in memory_gib:
                known = ", ".join(sorted(memory_gib)) or "nothing"
                raise SlurmParseError(
                    f"Slurm node {node.name} offers gres gpu:{kind}:{count}, but queue.slurm.gpu_memory_gib has no entry "
                    f"for {kind!r} (it maps {known}): add {kind}: <GiB of one such GPU>"
                )
            memory = min(float(memory_gib[kind]), MAX_GPU_MEMORY_GIB)
            model = model_names.get(kind, kind)
            used, busy = (None, None) if node.is_usable else (memory, 100.0)
            made = [
                GpuState(f"{node.name}/gpu{index + i}", node.name, model, memory, observed_used_gib=used, observed_util=busy)
                for i in range(count)
            ]
            gpus += made
            of_kind.setdefault(kind, []).extend(made)
            index += count
        if ours is not None and node.is_usable:
            foreign(node, of_kind, ours)
    return gpus


def foreign(node: SlurmNode, of_kind: dict[str, list[GpuState]], ours: set[str]) -> None:
    """Per gres type, mark seen full as many of `node`'s GPUs of that type (`of_kind`) that drape has free as Slurm
    has allocated there beyond drape's own (`ours`): other jobs' GPUs, the last by index first."""
    for kind, gpus in of_kind.items():
        used = min(sum(count for k, count in node.used if k == kind), len(gpus))  # untrusted: at most the node's
        free = [gpu for gpu in gpus if gpu.uuid not in ours]
        others = min(max(used - (len(gpus) - len(free)), 0), len(free))
        for gpu in free[len(free) - others :]:
            gpu.observed_used_gib, gpu.observed_util = gpu.total_gib, 100.0
