"""Each step's batch: drawn from the step's seeded generator, decoded ahead by worker processes.

Every source of randomness in a step (batch indices, noise, timesteps) comes from a generator
seeded by (seed, stage, step), so a resumed run draws exactly what an uninterrupted one does.

`StepBatches` is the work of one step: draw the step's indices, read and decode this rank's rows
from the local shards (`drape.data.reader.ShardIndex`) into uint8 arrays (in a worker, arrays
mapped in the file that hands the batch over).
`data.loader.workers` processes run it over the steps in order (`drape.training.loop.decoding`), at
most `data.loader.prefetch_batches` steps ahead, so memory is O(batch × prefetch) whatever the
stage's size; with 0 workers a thread runs it. On CUDA the batch is pinned; the trainer converts
uint8 to floats on its device, so the host-to-device copy moves a quarter of the bytes.

`BatchPrefetcher` is what the trainer sees: `next()` gives the next step's batch and measures
how long it blocked (the data-wait), and it fails, never hangs: a sample that does not decode
names its shard, member and step; a dead worker is an error within a poll (0.2 s); no batch in
`data.loader.timeout_seconds` is an error.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from drape import stage_index
from drape.config import LoaderConfig, PipelineConfig
from drape.data.partition import StageData, rank_partitions
from drape.training.loop.decoding import Allocate, DecodeError, ThreadSource, WorkerPool, allocate_in_memory
from drape.training.loop.distributed import DistContext

GENERATOR_STATE = "generator_state"


class BatchError(RuntimeError):
    """A batch that could not be built; names the stage and the step (and the shard and member, or the worker)."""


def step_generator(seed: int, stage: str, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + stage_index(stage) * 100_003 + step)


class StepBatches:
    """`make(step)`: this rank's rows of the step's global batch as uint8 arrays, and the
    generator's state after the draw (`GENERATOR_STATE`), for the decoding workers to run.

    Each step draws B/P indices into every data partition from the step's generator, in partition
    order (every rank draws all of them, so the generator is in the same state on every rank and
    world size), and keeps the rows of the partitions this rank holds. With one partition this is
    a plain uniform draw of B indices over the stage.
    """

    def __init__(self, data: StageData, owned: range, *, seed: int, stage: str, batch_size: int):
        data.check_holds(owned)
        self.data, self.owned, self.seed, self.stage = data, owned, seed, stage
        self.rows = batch_size // data.count
        if not self.rows:
            raise ValueError(f"a batch of {batch_size} cannot draw from each of {data.count} data partitions")

    def draw(self, step: int) -> tuple[list[np.ndarray], torch.Generator]:
        generator = step_generator(self.seed, self.stage, step)
        return [torch.randint(0, size, (self.rows,), generator=generator).numpy() for size in self.data.sizes], generator

    def __call__(self, step: int, allocate: Allocate = allocate_in_memory) -> dict[str, np.ndarray]:
        """The step's rows, decoded one by one into the arrays `allocate` gives (sized by the first row)."""
        drawn, generator = self.draw(step)
        rows = [(p, int(i)) for p in self.owned for i in drawn[p]]
        batch: dict[str, np.ndarray] = {}
        try:
            fields = self.data.partitions[self.owned[0]].model_fields  # pixels, or a latent dataset's latents
            for p in self.owned:  # the disk reads the later rows while the first ones decode
                self.data.partitions[p].prefetch(drawn[p], fields)
            for row, (p, i) in enumerate(rows):
                sample = self.data.partitions[p].sample(i, fields)
                if not batch:
                    batch = allocate({name: ((len(rows), *sample[name].shape), sample[name].dtype) for name in fields})
                for name in fields:
                    if sample[name].shape != batch[name].shape[1:]:
                        raise ValueError(
                            f"sample {sample['key']!r} of partition {p}: {name} is {sample[name].shape}, "
                            f"the batch's first sample's is {batch[name].shape[1:]} (one resolution per stage)"
                        )
                    batch[name][row] = sample[name]
        except Exception as error:  # noqa: BLE001 - re-raised with the step; a worker's traceback is noise
            raise DecodeError(f"step {step}: {error}") from None
        return batch | {GENERATOR_STATE: generator.get_state().numpy()}


class BatchPrefetcher:
    """This rank's batches of steps `start` … `stop` - 1, decoded ahead; `next()` measures the time it blocks.

    The workers start here, in the caller's thread, before the trainer builds its model: a process
    forked while another thread holds a lock (an import, a model build) can hang.
    """

    def __init__(
        self,
        data: StageData,
        owned: range,
        *,
        seed: int,
        stage: str,
        batch_size: int,
        start: int,
        stop: int,
        loader: LoaderConfig | None = None,
        pin_memory: bool = False,
    ):
        make = StepBatches(data, owned, seed=seed, stage=stage, batch_size=batch_size)
        self.data, self.owned, self.stage, self.step, self.stop = data, owned, stage, start, stop
        self.loader, self.pin_memory = loader or LoaderConfig(), pin_memory
        self.wait_seconds = 0.0
        steps, depth = range(start, stop), self.loader.prefetch_batches
        self.source: WorkerPool | ThreadSource = (
            WorkerPool(
                make,
                steps,
                workers=self.loader.workers,
                depth=depth,
                start_method=self.loader.start_method,
                handoff_dir=self.loader.handoff_dir,
            )
            if self.loader.workers and steps
            else ThreadSource(make, steps, depth=depth)
        )

    def next(self) -> tuple[tuple[int, dict[str, torch.Tensor], torch.Generator], float]:
        """((step, batch, generator), seconds blocked): the generator continues the step's draws."""
        step, started = self.step, time.perf_counter()
        if step >= self.stop:
            raise BatchError(f"stage {self.stage}: no step {step}, the stage stops at {self.stop}")
        try:
            arrays = self.source.get(step, self.loader.timeout_seconds)
        except DecodeError as error:
            hint = " (data.loader.timeout_seconds): is a read stuck?" if "no batch after" in str(error) else ""
            raise BatchError(f"stage {self.stage}, {error}{hint}") from None
        state = torch.from_numpy(arrays.pop(GENERATOR_STATE).copy())
        batch = {name: torch.from_numpy(values) for name, values in arrays.items()}
        if self.pin_memory:
            batch = {name: tensor.pin_memory() for name, tensor in batch.items()}
        waited = time.perf_counter() - started
        generator = torch.Generator()
        generator.set_state(state)
        self.wait_seconds += waited
        self.step = step + 1
        return (step, batch, generator), waited

    def close(self) -> None:
        """Stop decoding ahead and the workers with it (also when the stage ends early: an error, a kill)."""
        self.source.close()

    def rank_summary(self, rank: int, seconds: float) -> dict:
        """What this rank held and waited for, for the result and the run's MLflow metrics."""
        owned = list(self.owned)
        return {
            "rank": rank,
            "partitions": owned,
            "shards": [path for p in owned for path in self.data.shards.get(p, [])],
            "samples": sum(len(self.data.partitions[p]) for p in owned),
            "data_wait_seconds": self.wait_seconds,
            "data_wait_fraction": self.wait_seconds / seconds if seconds else 0.0,
        }

    @classmethod
    def for_rank(
        cls, config: PipelineConfig, data: StageData, context: DistContext, *, stage: str, start: int, stop: int
    ) -> BatchPrefetcher:
        """The prefetcher of this rank's partitions for steps `start` … `stop` - 1."""
        owned = rank_partitions(data.count, context.world_size, context.rank)
        return cls(
            data,
            owned,
            seed=config.seed,
            stage=stage,
            batch_size=config.train.batch_size,
            start=start,
            stop=stop,
            loader=config.data.loader,
            pin_memory=context.device.type == "cuda",
        )
