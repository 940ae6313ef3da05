"""Reading a config file without trusting it: bounded size, bounded alias expansion.

A YAML alias is a reference, so a file of a few hundred bytes can stand for billions of nodes
("billion laughs"): `yaml.safe_load` builds it in a blink, but everything that walks the result
(validation, an error message quoting a value) walks every expanded node. The file's size is
checked before it is read and its node graph, expanded, before anything is built from it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

MAX_CONFIG_BYTES = 1 << 20  # the largest shipped config is a few KiB
MAX_EXPANDED_NODES = 100_000  # every node once per alias that reaches it
MAX_DEPTH = 64  # nesting levels; the deepest shipped config nests about eight


class YamlBoundError(ValueError):
    """A YAML file beyond the bounds; the message names the file, the bound and the knob."""


def _expanded_nodes(root: yaml.Node, source: str) -> int:
    """Nodes of the document with every alias expanded, without expanding them (memoised);
    a recursive alias (a node inside itself) is refused."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if children_done:
            visiting.discard(id(node))
            sizes[id(node)] = min(1 + sum(sizes[id(child)] for child in children), MAX_EXPANDED_NODES + 1)
            continue
        if id(node) in visiting:
            raise YamlBoundError(f"{source}: a YAML alias refers to a node that contains it (a recursive structure)")
        visiting.add(id(node))
        stack.append((node, True))
        for child in children:
            if id(child) in visiting:
                raise YamlBoundError(f"{source}: a YAML alias refers to a node that contains it (a recursive structure)")
            stack.append((child, False))
    return sizes[id(root)]


def _depth(root: yaml.Node) -> int:
    """How deeply the document nests (each node once: aliases are bounded by `_expanded_nodes`)."""
    deepest, seen, stack = 0, set(), [(root, 1)]
    while stack and deepest <= MAX_DEPTH:
        node, level = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in _children(node))
    return deepest


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def read_yaml(path: Path, *, max_bytes: int = MAX_CONFIG_BYTES, max_nodes: int = MAX_EXPANDED_NODES) -> object:
    """The document in `path` (safe types only); YamlBoundError past `max_bytes` or, aliases
    expanded, `max_nodes` nodes; yaml.YAMLError when it is not YAML."""
    size = path.stat().st_size
    if size > max_bytes:
        raise YamlBoundError(f"{path}: {size} bytes, more than a config may hold ({max_bytes} bytes)")
    with open(path, "rb") as handle:  # at most the bound whatever the size said (a pipe, a /proc file: 0)
        raw = handle.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise YamlBoundError(f"{path}: more than {max_bytes} bytes, more than a config may hold")
    try:
        text = raw.decode()
    except UnicodeDecodeError as error:
        raise YamlBoundError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    try:  # PyYAML composes and constructs recursively: a file of a million `[` exhausts the stack
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise YamlBoundError(f"{path}: nested deeper than a config may be ({MAX_DEPTH} levels); refused") from None
    if node is None:
        return None
    if _depth(node) > MAX_DEPTH:
        raise YamlBoundError(f"{path}: nested deeper than a config may be ({MAX_DEPTH} levels); refused")
    expanded = _expanded_nodes(node, str(path))
    if expanded > max_nodes:
        raise YamlBoundError(
            f"{path}: its YAML aliases expand to more than {max_nodes} nodes (a config is a few hundred); "
            "refused before it is built"
        )
    return yaml.safe_load(text)
