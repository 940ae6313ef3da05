"""A stage's shards split across ranks without overlap, and a global batch the same on any world size.

The stage's shards are dealt into P disjoint *partitions* (shard i → partition i mod P). Each
step's global batch takes B/P rows from every partition, drawn by the step's seeded generator
from that partition's samples; rank r of W trains on rows r·B/W … (r+1)·B/W − 1, which are
exactly the rows of partitions r·P/W … (r+1)·P/W − 1. So a rank reads (pre-stages, indexes,
decodes) only its own partitions' shards, no shard is read by two ranks, and, P being
fixed, the global batch does not depend on W: 2 ranks train what 1 process trains, and a
checkpoint of one world size resumes on another.

P is `train.data_partitions`, by default the world size; it must be a multiple of the world
size and divide the global batch, and the stage needs at least P shards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from drape.data.reader import ShardIndex


class PartitionError(ValueError):
    pass


# the fewest samples a split may hold: the gates judge the control set as a set (a spread, a
# floor, a grid), which one sample is not; a training split needs one sample per data partition
MIN_SAMPLES = {"control": 2}
MIN_TRAINING_SAMPLES = 1


def check_split_samples(shards: list[dict], split: str, where: str) -> None:
    """PartitionError naming `split` of `where`, its sample count and the minimum, when the split
    is empty or holds fewer samples than any use of it can work with (`MIN_SAMPLES`)."""
    check_sample_count(sum(shard["samples"] for shard in shards), len(shards), split, where)


def check_sample_count(samples: int, shards: int, split: str, where: str) -> None:
    """`check_split_samples` for a split already counted: `samples` in `shards` shards."""
    minimum = MIN_SAMPLES.get(split, MIN_TRAINING_SAMPLES)
    if samples < minimum:
        use = "the gates judge it as a set" if split == "control" else "a stage trains on it"
        raise PartitionError(
            f"split {split!r} of {where} holds {samples} sample(s) in {shards} shard(s); {use}, so it needs "
            f"at least {minimum}: rebuild the dataset with more (data.synthetic.samples_per_stage, data.control_samples)"
        )


def resolve_partitions(configured: int | None, world_size: int, batch_size: int) -> int:
    """The partition count for this world size, checked against it and the global batch."""
    partitions = configured or world_size
    if partitions % world_size:
        raise PartitionError(
            f"train.data_partitions={partitions} must be a multiple of the world size {world_size}: "
            f"each rank takes a whole number of partitions"
        )
    if batch_size % partitions:
        raise PartitionError(
            f"train.batch_size={batch_size} (the global batch) must be divisible by the "
            f"{partitions} data partitions: every partition gives batch_size / partitions rows per step"
        )
    return partitions


def rank_partitions(partitions: int, world_size: int, rank: int) -> range:
    per_rank = partitions // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)


def partition_shards(shards: list[dict], partitions: int, *, what: str = "the stage") -> list[list[dict]]:
    """Shard i into partition i mod P; an error when a partition would be empty."""
    if len(shards) < partitions:
        raise PartitionError(
            f"{what} has {len(shards)} shard(s), fewer than the {partitions} data partitions "
            f"(one per rank by default): write smaller shards (data.shard_max_samples) or set "
            f"train.data_partitions lower"
        )
    dealt = [shards[p::partitions] for p in range(partitions)]
    for p, group in enumerate(dealt):
        if sum(shard["samples"] for shard in group) < MIN_TRAINING_SAMPLES:
            raise PartitionError(
                f"{what}: data partition {p} of {partitions} holds no sample (its {len(group)} shard(s) are empty); "
                f"every partition needs at least {MIN_TRAINING_SAMPLES}: set train.data_partitions lower or rebuild "
                "the dataset without empty shards"
            )
    return dealt


class SampleSource(Protocol):
    """Where a partition's samples come from: their keys, `sample(index, fields)`, one decoded
    sample {key, <fields>}, and `prefetch(indices, fields)`, a hint that those come next (a
    `ShardIndex`; a benchmark's baseline may hold them in memory)."""

    keys: list[str]
    model_fields: tuple[str, ...]  # what the model reads of a sample (pixels, or a latent dataset's latents)

    def __len__(self) -> int: ...

    def sample(self, index: int, fields: tuple[str, ...] | None = ...) -> dict: ...

    def prefetch(self, indices, fields: tuple[str, ...] | None = ...) -> None: ...


@dataclass
class StageData:
    """The partitions one rank holds, each a sample source (a `ShardIndex` over its local shards),
    and every partition's sample count."""

    partitions: Mapping[int, SampleSource]
    sizes: list[int]
    shards: dict[int, list[str]] = field(default_factory=dict)  # partition → shard paths, for reports

    @property
    def count(self) -> int:
        return len(self.sizes)

    def check_holds(self, wanted: Iterable[int]) -> None:
        missing = sorted(set(wanted) - set(self.partitions))
        if missing:
            raise PartitionError(f"this rank needs data partitions {missing} but holds {sorted(self.partitions)}")


def split_data(directory: str | Path, manifest: dict, split: str, *, partitions: int = 1) -> StageData:
    """Every partition of `split` from shards already under `directory` (a dataset, or a cache
    that holds them all), dealt and read as `load_stage_data` deals and reads them: for one
    process that holds the whole split (tests, benchmarks, tools)."""
    dealt = partition_shards(manifest["splits"][split], partitions, what=f"split {split!r}")
    held = {p: ShardIndex([Path(directory) / shard["path"] for shard in group]) for p, group in enumerate(dealt)}
    return StageData(held, [len(index) for index in held.values()], {p: [s["path"] for s in g] for p, g in enumerate(dealt)})


def load_stage_data(cache, stage: str, *, partitions: int, world_size: int, rank: int) -> StageData:
    """This rank's partitions of `stage` in `cache` (a ShardCache), indexed for reading on demand:
    only its own shards are fetched, and no sample is decoded until a batch needs it. Hold the
    split pinned (`cache.pin`) while reading."""
    dealt = partition_shards(cache.shards(stage), partitions, what=f"stage {stage!r}")
    mine = list(rank_partitions(partitions, world_size, rank))
    staged = cache.prestage(stage, keep=["control"], shards=[shard for p in mine for shard in dealt[p]])
    if staged.downloaded:  # shards that were not pre-staged: the trainer waited for them
        cache.read_wait_seconds += staged.seconds
    held = {p: ShardIndex([cache.local_path(shard) for shard in dealt[p]]) for p in mine}
    sizes = [sum(shard["samples"] for shard in group) for group in dealt]
    for p, index in held.items():
        if len(index) != sizes[p]:
            raise PartitionError(
                f"stage {stage!r}: partition {p}'s shards hold {len(index)} samples, the manifest says {sizes[p]}"
            )
    return StageData(held, sizes, {p: [shard["path"] for shard in dealt[p]] for p in mine})
