"""`extends:` in a config file: a file names one file or a list of them, read and merged in order,
then its own keys on top (`deep_merge`: mappings merge key by key, any other value replaces).

Production configs are overlays: one base, a model recipe and a cluster (configs/base/,
configs/models/, configs/clusters/), so what they share is written once and cannot drift. A config
is untrusted input, so every file named is held to bounds before it is read: its path, relative to
the file that names it, must resolve (symlinks followed) inside the configs root or inside the
folder of the file the chain started from; a chain may not name a file twice (a cycle), nest deeper
than `MAX_EXTENDS_DEPTH` or read more than `MAX_EXTENDS_FILES` files; each file is read through the
bounded loader (`drape.config.reading.loading.read_yaml`). Every refusal names the file, the field and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from drape.config.base import ConfigError
from drape.config.reading.loading import YamlBoundError, read_yaml
from drape.secrets import redact

EXTENDS = "extends"
MAX_EXTENDS_DEPTH = 8  # a config, a recipe, a base: 3; room for a team's own layers
MAX_EXTENDS_FILES = 32  # every file read for one config, repeats included: no fan-out blow-up
CONFIGS_ROOT = Path(__file__).resolve().parents[3] / "configs"


def deep_merge(base: dict, overrides: dict) -> dict:
    """A new dict: `overrides` merged into `base`, recursing into nested mappings."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_mapping(path: Path, what: str = "config") -> dict:
    """The YAML mapping in `path` (bounded read); ConfigError naming the file when it is missing,
    beyond the bounds, not YAML or not a mapping. An empty file is an empty mapping."""
    if not path.is_file():
        raise ConfigError(f"{path}: {what} file not found")
    try:
        data: Any = read_yaml(path)
    except YamlBoundError as error:
        raise ConfigError(str(error)) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {redact(error)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at the top level, got {type(data).__name__}")
    return data


def read_config_data(path: str | Path) -> dict:
    """The mapping the config at `path` stands for: the files its `extends:` names (recursively),
    merged in order, then its own keys; the `extends` key itself is gone."""
    path = Path(path)
    roots = (CONFIGS_ROOT, path.resolve().parent)
    return _resolve(path, chain=(), roots=roots, budget=[MAX_EXTENDS_FILES])


def _resolve(path: Path, *, chain: tuple[Path, ...], roots: tuple[Path, ...], budget: list[int]) -> dict:
    budget[0] -= 1
    if budget[0] < 0:
        raise ConfigError(f"{path}: {EXTENDS}: more than {MAX_EXTENDS_FILES} files in one config's chain")
    data = read_mapping(path)
    parents = _parents(path, data.pop(EXTENDS, None), roots)
    resolved = path.resolve()
    merged: dict = {}
    for parent in parents:
        target = parent.resolve()
        if target in (*chain, resolved):
            cycle = " → ".join(str(step) for step in (*chain, resolved, target))
            raise ConfigError(f"{path}: {EXTENDS}: a cycle: {cycle}")
        if len(chain) + 1 >= MAX_EXTENDS_DEPTH:
            names = " → ".join(str(step) for step in (*chain, resolved, target))
            raise ConfigError(f"{path}: {EXTENDS}: deeper than {MAX_EXTENDS_DEPTH} files: {names}")
        merged = deep_merge(merged, _resolve(parent, chain=(*chain, resolved), roots=roots, budget=budget))
    return deep_merge(merged, data)


def _parents(path: Path, named: object, roots: tuple[Path, ...]) -> list[Path]:
    """The files `path`'s `extends:` names, each checked to lie inside a root or `path`'s folder."""
    if named is None:
        return []
    names = [named] if isinstance(named, str) else named
    if not isinstance(names, list) or not names or not all(isinstance(name, str) and name for name in names):
        raise ConfigError(f"{path}: {EXTENDS}: expected a file name or a list of file names, got {named!r}")
    folder = path.resolve().parent
    parents = []
    for name in names:
        target = (folder / name).resolve()  # an absolute name stays absolute
        if not any(target.is_relative_to(root) for root in (*roots, folder)):
            allowed = ", ".join(str(root) for root in dict.fromkeys((*roots, folder)))
            raise ConfigError(
                f"{path}: {EXTENDS}: {name!r} resolves to {target}, outside the folders a config may extend from ({allowed})"
            )
        parents.append(target)
    return parents
