"""What a job's pod must see of the local disk: every path its config names, derived in one place.

A pod sees nothing of its node but its volumes, so every local path a stage, benchmark or
personalization job reads or writes must be mounted, at the same path. Each config field that can
name one declares how a job uses it (`drape.config.base.mounted`, `MOUNT_KINDS`): live folders
(`paths.root`, the shard cache, the loaders' hand-off folder), pretrained weights (the denoiser, the
VAE, the identity embedder and recognizer models, the eval networks), local stores (a file:// object
store, a SQLite tracking database). `job_paths` and `model_paths` walk the config's fields for those
declarations, so a field added with one is mounted with no change here, and tests/unit/test_mounts.py
fails for a field that could name a path and declares nothing.

Paths are resolved as the job resolves them (relative to the working directory); a path inside
another one of the same list is left to that one, and the pod's own memory (/dev/shm, where the
hand-off folder lives by default) is never a node directory. A denoiser given as a hub id is read
from the node's Hugging Face cache, which a pod does not have: it stays as given, and the
Kubernetes engine refuses it naming the field (scheduler/engines/kubernetes/pods.py).
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from pydantic import BaseModel

from drape.config.base import MOUNT_KINDS

WRITABLE = ("live", "store", "checkpoint")
READ_ONLY = ("model", "file")
POD_MEMORY = PurePosixPath("/dev/shm")  # the pod's own memory-backed emptyDir
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def declared(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """(dotted field, mount kind, reason for 'none') of every field of `model` and the models it nests
    that declares a mount kind."""
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        key = f"{prefix}{field.alias or name}"
        if "mount" in extra:
            yield key, str(extra["mount"]), str(extra.get("mount_why", ""))
        for nested in _models(field.annotation):
            yield from declared(nested, f"{key}.")


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [found for argument in typing.get_args(annotation) for found in _models(argument)]


def configured(config: BaseModel) -> Iterator[tuple[str, str, str]]:
    """(dotted field, mount kind, value) of every declared field `config` sets (lists of models: each item)."""
    for field, kind, _ in declared(type(config)):
        for value in _values(config, field.split(".")):
            if isinstance(value, str) and value:
                yield field, kind, value


def _values(node: object, keys: list[str]) -> Iterator[object]:
    if not keys:
        yield node
        return
    if isinstance(node, (list, tuple, dict)):  # a list or a mapping of models: each of them
        for item in node.values() if isinstance(node, dict) else node:
            yield from _values(item, keys)
        return
    head, *rest = keys
    model_fields = type(node).model_fields if isinstance(node, BaseModel) else {}
    name = next((n for n, f in model_fields.items() if (f.alias or n) == head), head)
    yield from _values(getattr(node, name, None), rest)


def local_path(kind: str, value: str) -> str | None:
    """The folder a pod must see for `value` of a field of mount `kind` (absolute when the value is a
    path; a hub id as given); None when it names nothing on local disk (an s3:// or http URL, an alias)."""
    if kind == "store":
        if value.startswith("sqlite:///"):
            return _resolved(value.removeprefix("sqlite:///"), parent=True)
        if value.startswith("file://"):
            return _resolved(value.removeprefix("file://"), parent=False)
        return None if "://" in value else _resolved(value, parent=False)
    if kind == "checkpoint":  # a registry alias has no '/'; a checkpoint folder's results go beside it
        return _resolved(value, parent=True) if "/" in value or value.startswith(".") else None
    if kind == "model" and not Path(value).expanduser().exists() and _HUB_ID.fullmatch(value) and not value.startswith("."):
        return value  # a hub id: the node's Hugging Face cache, which no pod has (pods.py refuses it)
    if kind in ("live", "model", "file"):
        return _resolved(value, parent=kind == "file")
    raise ValueError(f"mount kind {kind!r}: expected one of {', '.join(MOUNT_KINDS)}")


def _resolved(value: str, *, parent: bool) -> str:
    path = Path(value).expanduser().resolve()
    return str(path.parent if parent else path)


def _inside(path: str, others: list[str]) -> bool:
    pure = PurePosixPath(path)
    return any(pure != PurePosixPath(other) and pure.is_relative_to(other) for other in others)


def _unique(paths: list[str]) -> list[str]:
    """`paths` in order, without repeats, paths inside another of them, or the pod's memory."""
    kept = list(dict.fromkeys(paths))
    return [p for p in kept if not _inside(p, [*kept, str(POD_MEMORY)]) and p != str(POD_MEMORY)]


def paths_of(config, kinds: tuple[str, ...]) -> list[str]:
    """The folders of `config`'s fields of mount `kinds`, in field order, before de-duplication."""
    found = (local_path(kind, value) for _, kind, value in configured(config) if kind in kinds)
    return [path for path in found if path is not None]


def job_paths(config) -> list[str]:
    """The folders a job of `config` writes, which its pod mounts read-write at the same paths:
    `paths.root` (live storage, and the queue's files and default stores under it) first, then the
    shard cache, the loaders' hand-off folder, a local store or a benchmarked checkpoint's folder
    where they lie outside it."""
    return _unique(paths_of(config, WRITABLE))


def model_paths(config) -> list[str]:
    """The pretrained weights a job of `config` reads and never writes, which its pod mounts read-only
    at the same paths: the denoiser, the VAE, the recognizer models' folders, the folders of the
    identity embedder's ONNX file and of the eval networks' weights (read-only even inside a writable one)."""
    return _unique(paths_of(config, READ_ONLY))
