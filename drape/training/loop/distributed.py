"""Distributed training under torchrun: process group, DDP / FSDP2 wrapping, batch sharding, and
sharded checkpoints with `torch.distributed.checkpoint` (DCP).

- `init_from_env()` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) and joins the
  process group: NCCL on GPUs, gloo on CPU. Without torchrun it is a 1-process context.
- Every step draws the *global* batch from the step's seeded generator (as one process does) and
  each rank takes its contiguous slice, so N ranks with DDP's gradient averaging compute the same
  update as one process on the whole batch (tested with gloo: 2 ranks = 1 process).
- `parallelism: ddp` wraps the model in DistributedDataParallel; `fsdp` applies FSDP2
  `fully_shard` per transformer block and to the root (bf16 params with fp32 reduction on GPU).
- Intermediate checkpoints are DCP directories (`step-N.dcp/`), saved asynchronously where DCP
  can (`async_save`) so training does not stall on I/O; each rank writes its shards and rank 0
  writes `manifest.json` with the sha256 of every file last, which commits the checkpoint. A DCP
  checkpoint saved by N ranks loads on M (DCP reshards). DCP's `.metadata` is a pickle and its
  non-tensor items are `torch.load`ed with pickle allowed; drape reads neither that way: the
  metadata goes through an unpickler that admits only the classes DCP metadata is made of
  (`_MetadataUnpickler`), and the non-tensor items through ``torch.load(weights_only=True)`` (drape.torchfile), so a
  crafted checkpoint cannot run code, whatever its manifest says (the sha256 manifest proves
  integrity, not origin). The checkpoint a stage ends with (the one gated, promoted, archived) is
  always safetensors + manifest.
- A DCP checkpoint stores what trains, as a stage checkpoint does (`drape.training.checkpoints.checkpoint`):
  the model tensors the optimizer updates, their optimizer state and EMA; its manifest's ``frozen``
  names every other tensor by its content hash (`drape.training.checkpoints.base`: the same hash a stage
  checkpoint's base has). Those tensors come back from where the stage started (its init
  checkpoint, or the pretrained weights): `load_sharded` hashes the model it loads into and
  refuses it unless the hash is the recorded one, so the model is reassembled bit for bit. A DCP
  checkpoint without ``frozen`` (saved before) holds every tensor and loads as it did.
"""

from __future__ import annotations

import json
import os
import pickle  # noqa: S403 - only through _MetadataUnpickler's allowlist
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from drape.jsonfile import read_json_object
from drape.storage.checksum import sha256_file
from drape.storage.durable import fsync_dir, fsync_tree, write_synced
from drape.torchfile import load_tensors
from drape.training.checkpoints.base import cached_hash, check_digest


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def local_slice(self, global_batch: int) -> slice:
        if global_batch % self.world_size:
            raise ValueError(f"train.batch_size {global_batch} must be divisible by the {self.world_size} ranks")
        per_rank = global_batch // self.world_size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier()


def disk_leader(context: DistContext, folder: Path) -> bool:
    """Whether this process does the node-level work in `folder` (fetch, restore, free) for its disk.

    Probed, never assumed: each node's first process writes a marker named by a token rank 0 drew
    (fresh each job start) and rank `r`, then reads which ranks' markers it sees. Nodes that see
    each other's markers share the disk; of those, the lowest rank's node does the work and the
    others wait for it at the caller's next barrier, so two nodes never delete and restore one
    stage folder at once. Every rank must call this (collectives); rank 0 prints what it found.
    """
    import secrets

    if not context.is_distributed:
        return True
    token = [secrets.token_hex(8) if context.is_main else None]
    dist.broadcast_object_list(token, src=0)
    marker = folder / f".disk-probe-{token[0]}-{context.rank}"
    if context.local_rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        write_synced(marker, token[0] or "")
    context.barrier()
    seen = (
        sorted(int(p.name.rsplit("-", 1)[1]) for p in folder.glob(f".disk-probe-{token[0]}-*"))
        if context.local_rank == 0
        else None
    )
    gathered: list[list[int] | None] = [None] * context.world_size
    dist.all_gather_object(gathered, seen)
    if context.local_rank == 0:
        marker.unlink(missing_ok=True)
    disks = sorted({tuple(part) for part in gathered if part})
    if context.is_main:
        shared = [list(disk) for disk in disks if len(disk) > 1]
        found = (
            f"one disk for the nodes of ranks {shared}: the lowest rank's node alone fetches, restores and frees the stage folder"
            if shared
            else "on each node's own disk: each node fetches, restores and frees its stage folder"
        )
        print(f"drape: {folder} is {found}", flush=True)
    return seen is not None and (not seen or seen[0] == context.rank)  # its own marker unseen: it works alone


def init_from_env(device_preference: str = "auto") -> DistContext:
    """The torchrun context (joins the process group), or a 1-process context without torchrun."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_preference != "cpu" and torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", device_id=device if use_cuda else None)
    return DistContext(rank, world_size, local_rank, device)


def wrap_model(model: torch.nn.Module, context: DistContext, parallelism: str, bf16: bool) -> torch.nn.Module:
    """DDP or FSDP2 around `model` (unchanged in a 1-process context)."""
    if not context.is_distributed:
        return model
    if parallelism == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
        for block in model.sharded_blocks():  # type: ignore[operator]
            fully_shard(block, mp_policy=policy)
        frozen = set(model.frozen_parameters())  # type: ignore[operator]  # a VAE: whole on every rank, encoded outside forward
        fully_shard(model, mp_policy=policy, ignored_params=frozen or None)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[context.device.index] if context.device.type == "cuda" else None)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ema: dict | None, *, whole: bool = False) -> dict:
    """What a DCP checkpoint holds: the trained model tensors (those the optimizer updates; every
    tensor with `whole`), the optimizer's state, the EMA."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    if not whole:
        trained = _trained_names(optimizer_state)
        model_state = {name: tensor for name, tensor in model_state.items() if name in trained}
    state = {"model": model_state, "optimizer": optimizer_state}
    if ema is not None:
        state["ema"] = dict(ema)
    return state


def _trained_names(optimizer_state: dict) -> set[str]:
    """The parameters (fully qualified names) an optimizer state dict of `get_state_dict` updates."""
    return {name for group in optimizer_state["param_groups"] for name in group["params"]}


def frozen_record(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """``{sha256, tensors, bytes}`` of the model's tensors the optimizer does not update (the
    content hash of `drape.training.checkpoints.base`, cached on the model; under FSDP2 a collective)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    trained = _trained_names(get_optimizer_state_dict(model, optimizer))
    plain = unwrap(model)
    frozen = {name: tensor for name, tensor in plain.state_dict().items() if name not in trained}
    size = sum(tensor.numel() * tensor.element_size() for tensor in frozen.values())
    return {"sha256": cached_hash(plain, frozen), "tensors": len(frozen), "bytes": size}


class ShardedCheckpointer:
    """Saves DCP checkpoints (async where possible) and commits each with a manifest once written."""

    def __init__(self, context: DistContext, use_async: bool = True):
        self.context, self.use_async = context, use_async
        self.pending: tuple | None = None  # (future, path, manifest)
        self.stall_seconds = 0.0  # time the training loop spent blocked in save calls
        self.on_commit: Callable[[Path], None] | None = None  # rank 0, with each committed checkpoint folder
        # the background save runs its own collectives: on the training group they would interleave
        # with DDP's all-reduces differently on each rank and deadlock (torchtitan does the same)
        self.group = dist.new_group(backend="gloo") if use_async and context.is_distributed else None

    def save(self, path: Path, model, optimizer, ema: dict | None, manifest: dict) -> None:
        import torch.distributed.checkpoint as dcp

        started = time.perf_counter()
        self.wait()  # one save in flight at a time
        path = Path(path)
        state = _state(model, optimizer, ema)
        sharded = any(hasattr(t, "full_tensor") for t in unwrap(model).state_dict().values())
        if self.context.is_main or sharded:  # rank 0 writes the manifest; FSDP2 shards are gathered by all
            manifest = {**manifest, "frozen": frozen_record(model, optimizer)}
        if self.use_async and self.context.is_distributed:
            future = dcp.async_save(state, checkpoint_id=str(path), process_group=self.group)
            self.pending = (future, path, manifest)
        else:
            dcp.save(state, checkpoint_id=str(path))
            self._commit(path, manifest)
        self.stall_seconds += time.perf_counter() - started

    def wait(self) -> None:
        if self.pending is not None:
            future, path, manifest = self.pending
            future.result()
            self.pending = None
            self._commit(path, manifest)

    def _commit(self, path: Path, manifest: dict) -> None:
        """The manifest lists every rank's files, hashed where they were written: on nodes that share
        no disk each node holds its own ranks' shards (`on_commit` on each node then publishes them)."""
        self.context.barrier()
        held = _node_files(path) if self.context.local_rank == 0 else {}
        files = _all_files(held, self.context)
        if self.context.is_main:
            record = {**manifest, "format": "dcp", "world_size": self.context.world_size, "files": files}
            write_synced(path / ".manifest.json.tmp", json.dumps(record, indent=2))
            os.replace(path / ".manifest.json.tmp", path / "manifest.json")
            fsync_dir(path)
        if self.context.local_rank == 0 and self.on_commit is not None:
            self.on_commit(path)
        self.context.barrier()


def _node_files(path: Path) -> dict[str, str]:
    """name → sha256 of the shards this node wrote, made durable before the manifest commits them."""
    fsync_tree(path)
    return {p.name: sha256_file(p) for p in sorted(path.iterdir()) if p.is_file() and p.name != "manifest.json"}


def _all_files(held: dict[str, str], context: DistContext) -> dict[str, str]:
    """Every node's `held` files, merged (one node, or a shared disk: the same names, once)."""
    if not context.is_distributed:
        return held
    gathered: list[dict[str, str] | None] = [None] * context.world_size
    dist.all_gather_object(gathered, held)
    return {name: digest for part in gathered for name, digest in sorted((part or {}).items())}


def verify_dcp(path: str | Path) -> dict:
    """The manifest of a committed DCP checkpoint whose files all match it; raises otherwise."""
    from drape.training.checkpoints.checkpoint import CheckpointError

    path = Path(path)
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise CheckpointError(f"{path}: no manifest.json (an uncommitted or foreign DCP checkpoint)")
    try:
        manifest = read_json_object(manifest_path, "checkpoint manifest")
        files = manifest["files"]
        if not isinstance(files, dict):
            raise TypeError("files is not an object")
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{manifest_path}: not a DCP checkpoint manifest ({error})") from None
    present = {p.name for p in path.iterdir() if p.is_file() and p.name != "manifest.json"}
    if present != set(manifest["files"]):
        raise CheckpointError(f"{path}: files {sorted(present ^ set(manifest['files']))} differ from its manifest")
    for name, digest in manifest["files"].items():
        if sha256_file(path / name) != digest:
            raise CheckpointError(f"{path}/{name}: sha256 does not match the manifest drape wrote; not loading it")
    return manifest


_DCP_CLASSES = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """DCP metadata, and nothing else: a global outside what DCP writes is refused, never imported."""

    def __init__(self, handle, path: Path):
        super().__init__(handle)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        allowed = (
            module == "torch.distributed.checkpoint.metadata"
            or (module, name) in _DCP_CLASSES
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            from drape.training.checkpoints.checkpoint import CheckpointError

            raise CheckpointError(f"{self.path}: DCP metadata refers to {module}.{name}, which DCP never writes; not loading it")
        return super().find_class(module, name)


def _safe_dcp(path: Path):
    """A DCP reader and planner that unpickle nothing but DCP metadata and plain values."""
    import io

    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.planner import ReadItem

    with open(path / ".metadata", "rb") as handle:  # read here: a refusal is our error, not one DCP wraps
        checked = _MetadataUnpickler(handle, path).load()

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            metadata = checked
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            loaded = load_tensors(value, f"{path}: checkpoint item {read_item.dest_index.fqn}")  # tensors and plain values only
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._traverse import set_element

                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return Reader(str(path)), Planner()


def load_sharded(path: str | Path, model, optimizer, ema: dict | None) -> dict:
    """Load a verified DCP checkpoint into (possibly wrapped) model, optimizer and EMA on any world size."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    manifest = verify_dcp(path)
    frozen = manifest.get("frozen")
    if frozen is not None:  # the trained tensors only: the rest must be the very tensors it was trained with
        expected = check_digest(frozen.get("sha256") if isinstance(frozen, dict) else None, f"{path}/manifest.json frozen")
        found = frozen_record(model, optimizer)["sha256"]
        if found != expected:
            from drape.training.checkpoints.checkpoint import CheckpointError

            raise CheckpointError(
                f"{path} holds the trained tensors of a model whose other tensors hash to {expected} (its manifest.json), "
                f"but the model it would load into has {found}: not the weights the stage started from; not loading it"
            )
    state = _state(model, optimizer, ema, whole=frozen is None)
    reader, planner = _safe_dcp(Path(path))
    dcp.load(state, storage_reader=reader, planner=planner)
    options = StateDictOptions(strict=frozen is None)  # not strict: the frozen rest is verified above
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"], options=options)
    if ema is not None and "ema" in state:
        for name, tensor in state["ema"].items():
            ema[name].copy_(tensor)
    return manifest


def full_model_state(model: torch.nn.Module) -> dict[str, Any]:
    """The whole model's state on CPU, gathered from the FSDP shards; a collective, rank 0 receives it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
