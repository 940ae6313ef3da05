"""The static fleet inventory (`queue.inventory`, and the fleet `drape queue simulate`, `drape queue
kueue` and `drape queue sbatch` are given): a YAML file of GPU groups, read without trusting it.

The file goes through the bounded loader (`drape.config.reading.loading.read_yaml`: size and alias expansion
bounded before anything is built), every number must be finite and within any real machine or
fleet (`MAX_*`), names hold no control character, and every refusal is a `FleetFileError` naming
the file, the group and the field, never a traceback.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from drape.config import names
from drape.config.reading.loading import YamlBoundError, read_yaml
from scheduler.policy import GpuState

MAX_GPU_MEMORY_GIB = 4096.0  # one GPU's memory: 30× today's largest
MAX_GPUS_PER_NODE = 64
MAX_JOB_GPUS = 1024  # one job's GPUs (a gang across nodes): a queued job's or a trace's
MAX_NODES_PER_GROUP = 10_000
MAX_FLEET_GPUS = 100_000  # the simulator models every GPU: a fleet past this is a typo, not a plan


class FleetFileError(ValueError):
    """A fleet file that cannot be used; names the file, group and field."""


def has_control(text: object) -> bool:
    return isinstance(text, str) and any(ord(character) < 32 or ord(character) == 127 for character in text)


def load_fleet(path: str | Path) -> list[GpuState]:
    """A fleet YAML: ``groups: [{model, memory_gib, nodes, gpus_per_node[, node_prefix | node_names]}]``,
    read bounded (`read_yaml`) and checked group by group before a GPU is listed. A group's nodes
    are ``<node_prefix>-00``, ``-01``, … or, with `node_names`, the cluster's own names (one per node,
    e.g. ``[gpu-a100-r07n03, gpu-a100-r07n04]``), unique across the fleet."""
    path = Path(path)
    if not path.is_file():
        raise FleetFileError(f"{path}: fleet file not found")
    try:
        data = read_yaml(path) or {}
    except YamlBoundError as error:
        raise FleetFileError(str(error)) from None
    except yaml.YAMLError as error:
        raise FleetFileError(f"{path}: not YAML ({str(error).splitlines()[0]})") from None
    groups = data.get("groups", []) if isinstance(data, dict) else None
    if not isinstance(groups, list):
        raise FleetFileError(f"{path}: expected a mapping with groups: [{{model, memory_gib, nodes, gpus_per_node}}]")
    gpus: list[GpuState] = []
    seen: set[str] = set()
    for number, group in enumerate(groups):
        at = f"{path}: groups[{number}]"
        model, memory, nodes, per_node, prefix = _fleet_group(group, at)
        if len(gpus) + nodes * per_node > MAX_FLEET_GPUS:
            raise FleetFileError(f"{at}: the fleet would hold more than {MAX_FLEET_GPUS} GPUs")
        names = _node_names(group, nodes, prefix, at)
        if twice := sorted(seen.intersection(names)):
            raise FleetFileError(f"{at}: node {twice[0]} is named by an earlier group too")
        seen.update(names)
        for name in names:
            gpus += [GpuState(f"{name}/gpu{index}", name, model, memory) for index in range(per_node)]
    if not gpus:
        raise FleetFileError(f"{path}: no GPUs (expected groups: [{{model, memory_gib, nodes, gpus_per_node}}])")
    return gpus


def _node_names(group: dict, nodes: int, prefix: str, at: str) -> list[str]:
    """The group's node names: `node_names` checked (as many as `nodes`, each a node name), else `<prefix>-NN`."""
    listed = group.get("node_names")
    if listed is None:
        return [f"{prefix}-{node:02d}" for node in range(nodes)]
    if not isinstance(listed, list) or len(listed) != nodes:
        raise FleetFileError(f"{at}: node_names must list {nodes} name(s), one per node")
    bad = [name for name in listed if not (isinstance(name, str) and names.NODE_NAME.fullmatch(name))]
    if bad:  # the grammar sbatch's --nodelist and Kubernetes' node affinity are written with (drape/config/names.py)
        raise FleetFileError(f"{at}: node_names holds {str(bad[0])[:40]!r}: expected {names.NODE_EXPECTED}")
    if len(set(listed)) != len(listed):
        raise FleetFileError(f"{at}: node_names lists a node twice")
    return listed


GROUP_KEYS = ("model", "memory_gib", "nodes", "gpus_per_node", "node_prefix", "node_names")  # a misspelt one is an error


def _fleet_group(group: object, at: str) -> tuple[str, float, int, int, str]:
    """(model, memory_gib, nodes, gpus_per_node, node prefix) of one group, each checked."""
    try:
        if not isinstance(group, dict):
            raise TypeError(f"a {type(group).__name__}")
        model, memory = group["model"], float(group["memory_gib"])
        counts = [group["nodes"], group["gpus_per_node"]]
        if not all(isinstance(count, int) and not isinstance(count, bool) for count in counts):
            raise TypeError("nodes and gpus_per_node must be whole numbers")
    except (KeyError, TypeError, ValueError) as error:
        raise FleetFileError(f"{at}: expected model, memory_gib, nodes, gpus_per_node ({error})") from None
    if unknown := sorted(str(key) for key in group if key not in GROUP_KEYS):
        raise FleetFileError(f"{at}: unknown key(s) {unknown}; a group has {', '.join(GROUP_KEYS)}")
    nodes, per_node = counts
    prefix = group.get("node_prefix", str(model).lower().replace(" ", "-"))
    if not isinstance(model, str) or not model or not isinstance(prefix, str) or has_control(model) or has_control(prefix):
        raise FleetFileError(f"{at}: model and node_prefix must be non-empty names without control characters")
    try:  # its nodes' names reach sbatch's --nodelist and Kubernetes' node affinity (`node_names`: checked as listed)
        if group.get("node_names") is None:
            names.node_name(f"{prefix}-00", f"{at}: node_prefix {prefix!r} makes node")
    except names.NameRefused as error:
        raise FleetFileError(str(error)) from None
    if not (math.isfinite(memory) and 0 < memory <= MAX_GPU_MEMORY_GIB):
        raise FleetFileError(f"{at}: memory_gib must be a finite number in (0, {MAX_GPU_MEMORY_GIB:g}], got {memory}")
    if not (0 <= nodes <= MAX_NODES_PER_GROUP and 1 <= per_node <= MAX_GPUS_PER_NODE):
        raise FleetFileError(
            f"{at}: nodes must be in [0, {MAX_NODES_PER_GROUP}] and gpus_per_node in [1, {MAX_GPUS_PER_NODE}], "
            f"got {nodes} and {per_node}"
        )
    return model, memory, nodes, per_node, prefix
