"""Each step's batch: drawn from the step's seeded generator, built ahead in a thread.

Every source of randomness in a step (batch indices, noise, timesteps) comes from a generator
seeded by (seed, stage, step), so a resumed run draws exactly what an uninterrupted one does.
"""

from __future__ import annotations

import queue
import threading
import time

import torch

from drape import stage_index
from drape.config import PipelineConfig
from drape.data.dataset import to_model_inputs
from drape.data.partition import StageData, rank_partitions
from drape.training.distributed import DistContext


def step_generator(seed: int, stage: str, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + stage_index(stage) * 100_003 + step)


class BatchPrefetcher:
    """Builds this rank's rows of the batch of step i+1.. in a thread while step i runs; measures time blocked.

    Each step draws B/P indices into every data partition from the step's generator, in partition
    order (every rank draws all of them, so the generator is in the same state on every rank and
    world size), and keeps the rows of the partitions this rank holds. With one partition this is
    a plain uniform draw of B indices over the stage.
    """

    def __init__(
        self, data: StageData, owned: range, *, seed: int, stage: str, batch_size: int, start: int, stop: int, depth: int = 2
    ):
        data.check_holds(owned)
        self.data, self.owned, self.seed, self.stage = data, owned, seed, stage
        self.rows = batch_size // data.count
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._fill, args=(start, stop), daemon=True)
        self.thread.start()
        self.wait_seconds = 0.0

    def _fill(self, start: int, stop: int) -> None:
        self.failed_step = start
        try:
            for step in range(start, stop):
                self.failed_step = step
                generator = step_generator(self.seed, self.stage, step)
                drawn = [torch.randint(0, size, (self.rows,), generator=generator).numpy() for size in self.data.sizes]
                parts = [to_model_inputs(self.data.partitions[p].take(drawn[p])) for p in self.owned]
                batch = parts[0] if len(parts) == 1 else {k: torch.cat([part[k] for part in parts]) for k in parts[0]}
                self.queue.put((step, batch, generator))
        except BaseException as error:  # noqa: BLE001 - surfaced by next(), not lost in the thread
            self.error = error
            self.queue.put(None)

    def next(self):
        started = time.perf_counter()
        item = self.queue.get()
        waited = time.perf_counter() - started
        if item is None:
            raise RuntimeError(
                f"stage {self.stage}: building the batch of step {self.failed_step} failed: {self.error}"
            ) from self.error
        self.wait_seconds += waited
        return item, waited

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
        return cls(data, owned, seed=config.seed, stage=stage, batch_size=config.train.batch_size, start=start, stop=stop)
