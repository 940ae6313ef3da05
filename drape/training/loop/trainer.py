"""Stage trainer: trains one stage's parameter subset, checkpoints, resumes. No Prefect inside.

Every source of randomness in a step (batch indices, noise, timesteps, condition dropout) comes
from a generator seeded by (seed, stage, step) (`drape.training.loop.batches`), and the learning rate
is a function of the step (`drape.training.loop.optim`), so a run killed mid-stage and resumed from its
newest checkpoint ends with exactly the weights of an uninterrupted run. One step, its micro-batches and its
loss are `drape.training.loop.step`. Batches are decoded ahead by worker processes (`BatchPrefetcher`); the time
the loop blocks on it is the data-wait that gets logged. The loop asks and the components decide: `Checkpointer`
owns when and how to save (and how a checkpoint is stored: `train.checkpoint_compression`), `StepMetrics` when to log.

`drape.training.jobs.stage_job` runs a stage end to end (data, then this); `python -m drape.train`
is its command line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

import torch

from drape import Mode, parse_mode
from drape.config import PipelineConfig
from drape.data.partition import StageData, resolve_partitions
from drape.layout import ADAPTERS, StagePaths, bases_dir, checkpoint_name
from drape.ops.metrics import DATA_WAIT, STEP_SECONDS
from drape.training.checkpoints.checkpoint import read_manifest, save_checkpoint
from drape.training.checkpoints.lora import is_lora_pass, merge, save_adapter
from drape.training.loop import stop
from drape.training.loop.batches import BatchPrefetcher
from drape.training.loop.distributed import DistContext, ShardedCheckpointer, full_model_state, unwrap
from drape.training.loop.optim import check_optimizer, lr_schedule
from drape.training.loop.state import TrainingState, prepare_training, resume_step
from drape.training.loop.step import train_step
from drape.training.recipes.model import TryOnModel, build_model, trainable_parameter_names
from drape.training.recipes.objective import build_objective

MetricsSink = Callable[[dict[str, float], int], None]


@dataclass
class TrainResult:
    stage: str
    steps: int
    resumed_from_step: int
    final_loss: float
    checkpoint: str
    train_seconds: float
    data_wait_seconds: float
    samples_per_second: float
    checkpoint_stall_seconds: float = 0.0  # time the loop blocked in checkpoint saves (whole, sharded, adapters)
    ranks: list[dict] = field(default_factory=list)  # per rank: partitions, shards, samples held, data-wait
    loop_started_at: float = 0.0  # Unix time the first step began (rank 0): start-up ends here, for run costs
    device: str = ""  # what it trained on: the GPU model, or 'cpu'

    @property
    def data_wait_fraction(self) -> float:
        return self.data_wait_seconds / self.train_seconds if self.train_seconds else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "data_wait_fraction": self.data_wait_fraction}

    @classmethod
    def from_dict(cls, payload: dict) -> TrainResult:
        """The result a job wrote (`to_dict`); extra keys (peak memory, world size) are ignored."""
        return cls(**{name: payload[name] for name in cls.__dataclass_fields__ if name in payload})


def resolve_device(requested: str) -> torch.device:
    """'auto' picks CUDA when present; asking for 'cuda' without a GPU is an error."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device is 'cuda' but no CUDA device is available")
    return torch.device("cuda" if requested != "cpu" and torch.cuda.is_available() else "cpu")


def total_steps(config: PipelineConfig, stage: str, mode: str) -> int:
    """Steps of `stage` in `mode`: the stage's `steps` in a full run, `finetune_steps` in a fine-tune pass."""
    stage_config = config.train.stages[stage]
    return stage_config.steps if parse_mode(mode) is Mode.FULL else stage_config.finetune_steps


class Checkpointer:
    """Owns the save cadence: whole checkpoints every `checkpoint_every` steps in one process; under
    torchrun sharded DCP intermediates (`step-N.dcp`) and one whole checkpoint at the stage's end,
    which is what gates, promotion and the archive read. A LoRA pass saves adapter checkpoints
    (`adapters/step-N`) at the cadence and the merged model once, at its end."""

    def __init__(
        self,
        config: PipelineConfig,
        stage_dir: Path,
        context: DistContext,
        stage: str,
        mode: str,
        total: int,
        data_manifest_hash: str,
        latest: Path | None = None,
        on_saved: Callable[[Path], None] | None = None,
    ):
        self.config, self.paths, self.total, self.context = config, StagePaths(stage_dir), total, context
        self.manifest = {
            "config": config.model_dump(mode="json"),
            "stage": stage,
            "mode": mode,
            "total_steps": total,
            "data_manifest_hash": data_manifest_hash,
        }
        self.every = config.train.checkpoint_every
        self.bases = bases_dir(config, stage_dir)  # where the frozen base of its stage checkpoints goes, once
        # called with each checkpoint or adapter folder once complete (the store hand-off publishes it): on
        # the main rank, which writes whole checkpoints and adapters, and for sharded ones on each node's first
        self.on_saved = on_saved if context.is_main else None
        self.sharded = ShardedCheckpointer(context, use_async=config.train.async_checkpoint) if context.is_distributed else None
        if self.sharded is not None:
            self.sharded.on_commit = on_saved
        self.latest = latest  # the newest whole checkpoint: where the stage resumed from, then the last one saved
        self.stall_seconds = 0.0  # time the training loop spent blocked in `save` and `finish`

    def save(self, step: int, state: TrainingState, loss: float) -> None:
        """Save after `step` if the cadence says so (the time it blocks is `stall_seconds`)."""
        started = time.perf_counter()
        try:
            self._save(step, state, loss)
        finally:
            self.stall_seconds += time.perf_counter() - started

    def _save(self, step: int, state: TrainingState, loss: float) -> None:
        final, due = step == self.total, step % self.every == 0
        manifest = {**self.manifest, "step": step, "loss": loss}
        directory = self.paths.checkpoints
        if state.lora is not None:
            if due or final:
                self._save_adapter(step, state, manifest)
                self._saved(self.paths.adapters / checkpoint_name(step))
            if final:
                self.latest = self._saved(_save_merged(directory / checkpoint_name(step), state, manifest, self))
        elif self.sharded is not None and due and not final:
            self.sharded.save(directory / checkpoint_name(step, sharded=True), state.model, state.optimizer, state.ema, manifest)
        elif final or (self.sharded is None and due):
            if self.sharded is not None:
                self.sharded.wait()
            self.latest = self._saved(_save_whole(directory / checkpoint_name(step), state, manifest, self))

    def save_now(self, step: int, state: TrainingState, loss: float) -> None:
        """Save after `step` whatever the cadence (training stops here), unless the cadence just did;
        returns once it is on disk (a sharded one committed, so published next)."""
        if step % self.every:
            manifest = {**self.manifest, "step": step, "loss": loss}
            if state.lora is not None:
                self._save_adapter(step, state, manifest)
                self._saved(self.paths.adapters / checkpoint_name(step))
            elif self.sharded is not None:
                path = self.paths.checkpoints / checkpoint_name(step, sharded=True)
                self.sharded.save(path, state.model, state.optimizer, state.ema, manifest)
            else:
                self.latest = self._saved(_save_whole(self.paths.checkpoints / checkpoint_name(step), state, manifest, self))
        if self.sharded is not None:
            self.sharded.wait()

    def _saved(self, path: Path) -> Path:
        if self.on_saved is not None:
            self.on_saved(path)
        return path

    def finish(self, state: TrainingState) -> None:
        """A LoRA pass stopped between its last adapter and the merged checkpoint: merge that adapter now."""
        if state.lora is not None and self.latest is None and state.start_step == self.total:
            started = time.perf_counter()
            adapter = self.paths.adapters / checkpoint_name(self.total)
            manifest = {**self.manifest, "step": self.total, "loss": read_manifest(adapter).get("loss", float("nan"))}
            merged = _save_merged(self.paths.checkpoints / checkpoint_name(self.total), state, manifest, self)
            self.latest = self._saved(merged)
            self.stall_seconds += time.perf_counter() - started

    def _save_adapter(self, step: int, state: TrainingState, manifest: dict) -> None:
        assert state.lora is not None
        if self.context.is_main:  # DDP: every rank holds the same adapter and moments
            save_adapter(
                self.paths.adapters / checkpoint_name(step),
                model=unwrap(state.model),
                spec=state.lora,
                optimizer=state.optimizer,
                names=state.names,
                ema=state.ema,
                manifest=manifest,
            )
        self.context.barrier()


def _save_merged(path: Path, state: TrainingState, manifest: dict, saver: Checkpointer) -> Path:
    """A LoRA pass's end: rank 0 folds the adapter into the base (`lora.merge`, in place: nothing
    trains after it) and writes an ordinary checkpoint, which names the adapter it came from. Its
    stage tensors are those the stage trains in a full pass, so it shares the full pass's base."""
    assert state.lora is not None
    if saver.context.is_main:
        plain = cast(TryOnModel, unwrap(state.model))
        ema = merge(plain, state.ema)
        patterns = saver.config.train.stages[str(saver.manifest["stage"])].trainable
        save_checkpoint(
            path,
            model=plain,
            optimizer=None,
            trainable_names=[f"{target}.weight" for target in state.lora.targets],
            ema=ema,
            manifest={**manifest, "lora": {**state.lora.describe(), "adapter": f"{ADAPTERS}/{path.name}"}},
            bases=saver.bases,
            stage_names=trainable_parameter_names(patterns, [n for n, _ in plain.named_parameters()], plain.frozen_prefixes),
            compress=saver.config.train.checkpoint_compression == "planes",
        )
    saver.context.barrier()
    return path


def _save_whole(path: Path, state: TrainingState, manifest: dict, saver: Checkpointer) -> Path:
    """The safetensors checkpoint (rank 0 writes it; the whole model gathered under FSDP, which keeps
    no optimizer state in it): a stage checkpoint over its frozen base (`drape.training.checkpoints.checkpoint`)."""
    config, context = saver.config, saver.context
    fsdp = context.is_distributed and config.train.parallelism == "fsdp"
    plain, ema = cast(TryOnModel, unwrap(state.model)), state.ema
    if fsdp:
        whole = full_model_state(state.model)  # collective: every rank takes part, rank 0 receives the whole state
        ema = {n: t.full_tensor() if hasattr(t, "full_tensor") else t for n, t in ema.items()} if ema is not None else None
        if context.is_main:
            plain = build_model(config, pretrained=False)
            plain.load_state_dict(whole)
    if context.is_main:
        save_checkpoint(
            path,
            model=plain,
            optimizer=None if fsdp else state.optimizer,
            trainable_names=state.names,
            ema=ema,
            manifest=manifest,
            bases=saver.bases,
            moments=torch.bfloat16 if config.train.checkpoint_moments == "bfloat16" else None,
            compress=config.train.checkpoint_compression == "planes",
        )
    context.barrier()
    return path


class StepMetrics:
    """Per-step Prometheus histograms (labelled run, stage, rank) and, every `log_every` steps, the sink."""

    def __init__(
        self,
        config: PipelineConfig,
        stage: str,
        total: int,
        context: DistContext,
        sink: MetricsSink | None,
        labels: dict[str, str] | None,
    ):
        full = {"run": "", "stage": stage, **(labels or {}), "rank": str(context.rank)}
        self.data_wait, self.step_time = DATA_WAIT.labels(**full), STEP_SECONDS.labels(**full)
        self.stage, self.total, self.batch_size, self.every = stage, total, config.train.batch_size, config.train.log_every
        self.sink = sink if context.is_main else None

    def record(self, step: int, loss: float, step_seconds: float, waited: float) -> None:
        self.data_wait.observe(waited)
        self.step_time.observe(step_seconds + waited)
        if self.sink and (step % self.every == 0 or step == self.total):
            self.sink(
                {
                    f"{self.stage}/loss": loss,
                    f"{self.stage}/step_seconds": step_seconds + waited,
                    f"{self.stage}/data_wait_seconds": waited,
                    f"{self.stage}/samples_per_second": self.batch_size / max(step_seconds + waited, 1e-9),
                },
                step,
            )

    def record_ranks(self, ranks: list[dict]) -> None:
        if self.sink:
            self.sink({f"{self.stage}/data_wait_fraction/rank{r['rank']}": r["data_wait_fraction"] for r in ranks}, self.total)


def train_stage(
    config: PipelineConfig,
    *,
    stage: str,
    data: StageData,
    out_dir: str | Path,
    init_checkpoint: str | Path | None,
    mode: str = Mode.FULL,
    data_manifest_hash: str = "",
    log_metrics: MetricsSink | None = None,
    progress: Callable[[int, int], None] | None = None,
    metric_labels: dict[str, str] | None = None,
    context: DistContext | None = None,
    on_saved: Callable[[Path], None] | None = None,
) -> TrainResult:
    """Train `stage` on `data`, checkpointing under `out_dir`/checkpoints (a LoRA fine-tune pass:
    adapters under `out_dir`/adapters, the merged model at the end, `drape.training.checkpoints.lora`).

    `data` is this rank's `StageData` (`load_stage_data`, or `split_data` for a split on disk).
    Starts from `init_checkpoint` (or fresh weights), or resumes from the newest checkpoint
    already in `out_dir`. `mode` 'full' runs the stage's `steps`, 'finetune' its
    `finetune_steps`. The first batches are decoding while the model is built. Every step's
    data-wait and duration go to the Prometheus histograms ``drape_data_wait_seconds`` and
    ``drape_train_step_seconds`` labelled `metric_labels` (run, stage) and the rank. `on_saved` is
    called on the main rank with every checkpoint and adapter folder once it is complete.
    """
    total, train = total_steps(config, stage, mode), config.train
    context = context or DistContext(device=resolve_device(train.device))
    partitions = resolve_partitions(train.data_partitions, context.world_size, train.batch_size)
    if data.count != partitions:
        raise ValueError(f"stage {stage}: data is dealt into {data.count} partitions, the run uses {partitions}")
    lora = is_lora_pass(config, mode)
    check_optimizer(train, context.device)
    start = resume_step(out_dir, lora=lora)
    prefetcher = BatchPrefetcher.for_rank(config, data, context, stage=stage, start=start, stop=total)
    try:
        state = prepare_training(config, stage, out_dir, init_checkpoint, context, lora=lora)
        state.lr_schedule = lr_schedule(train, state.optimizer, total, state.start_step)
        checkpointer = Checkpointer(
            config, Path(out_dir), context, stage, mode, total, data_manifest_hash, state.resumed_from, on_saved
        )
        metrics = StepMetrics(config, stage, total, context, log_metrics, metric_labels)
        started, started_at = time.perf_counter(), time.time()
        loss = _train_steps(config, state, prefetcher, metrics, checkpointer, context, progress)
        checkpointer.finish(state)
    finally:
        prefetcher.close()
    if checkpointer.latest is None:
        raise RuntimeError(f"stage {stage}: nothing to train ({total} steps) and no checkpoint to resume from")
    seconds, trained = time.perf_counter() - started, total - state.start_step
    ranks = _per_rank(context, prefetcher.rank_summary(context.rank, seconds))
    if trained:
        metrics.record_ranks(ranks)
    throughput = trained * train.batch_size / seconds if seconds else 0.0
    timing = (seconds, prefetcher.wait_seconds, throughput, checkpointer.stall_seconds)
    latest, device = str(checkpointer.latest), device_name(context.device)
    return TrainResult(stage, total, state.start_step, loss, latest, *timing, ranks, started_at, device)


def _train_steps(
    config: PipelineConfig,
    state: TrainingState,
    prefetcher: BatchPrefetcher,
    metrics: StepMetrics,
    checkpointer: Checkpointer,
    context: DistContext,
    progress: Callable[[int, int], None] | None,
) -> float:
    """The stage's remaining steps, each recorded and offered to the checkpointer; the last loss (NaN: none ran)."""
    objective = build_objective(config.diffusion)
    loss = float("nan")
    state.model.train()
    if state.start_step < checkpointer.total and stop.requested(context):  # asked during start-up: nothing new to save
        raise stop.StopRequested(state.start_step, started=state.start_step, saved=False)
    for _ in range(state.start_step, checkpointer.total):
        (step, batch, generator), waited = prefetcher.next()
        step_started = time.perf_counter()
        loss, done = _global_mean(train_step(config, state, objective, batch, generator, context), context), step + 1
        metrics.record(done, loss, time.perf_counter() - step_started, waited)
        checkpointer.save(done, state, loss)
        if progress and context.is_main:
            progress(done, checkpointer.total)
        if done < checkpointer.total and stop.requested(context):  # SIGTERM / SIGUSR1: save this step, stop
            checkpointer.save_now(done, state, loss)
            raise stop.StopRequested(done, started=state.start_step)
    return loss


def _per_rank(context: DistContext, mine: dict) -> list[dict]:
    """Every rank's `mine`, in rank order (a collective under torchrun)."""
    if not context.is_distributed:
        return [mine]
    gathered: list = [None] * context.world_size
    torch.distributed.all_gather_object(gathered, mine)
    return gathered


def _global_mean(loss: torch.Tensor, context: DistContext) -> float:
    if context.is_distributed:
        loss = loss.clone()
        torch.distributed.all_reduce(
            loss, op=torch.distributed.ReduceOp.AVG if context.device.type == "cuda" else torch.distributed.ReduceOp.SUM
        )
        if context.device.type != "cuda":  # gloo has no AVG
            loss /= context.world_size
    return float(loss)


def device_name(device: torch.device) -> str:
    """The GPU model (`torch.cuda.get_device_name`), or 'cpu'."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def peak_memory_gib(device: torch.device) -> float:
    """Peak GPU memory of this process (`torch.cuda.max_memory_allocated`); on CPU its peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
