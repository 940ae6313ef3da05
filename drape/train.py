"""Stage trainer: trains one stage's parameter subset, checkpoints, resumes. No Prefect inside.

Every source of randomness in a step (batch indices, noise, timesteps) comes from a generator
seeded by (seed, stage, step), so a run killed mid-stage and resumed from its newest
checkpoint ends with exactly the weights of an uninterrupted run. Batches are prepared by a
background thread; the time the loop blocks on it is the data-wait that gets logged.

Run it alone: ``python -m drape.train --config configs/demo.yaml --stage identity``.
"""

from __future__ import annotations

import argparse
import queue
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch.nn import functional as F

from drape import STAGES
from drape.checkpoint import (checkpoint_name, checkpoint_step, list_checkpoints, load_model, load_training_state,
                              save_checkpoint)
from drape.config import PipelineConfig, trainable_parameter_names
from drape.data.dataset import to_model_inputs
from drape.data.partition import StageData, rank_partitions, resolve_partitions
from drape.distributed import (DCP_SUFFIX, DistContext, ShardedCheckpointer, full_model_state, init_from_env, load_sharded,
                               unwrap, wrap_model)
from drape.metrics import DATA_WAIT, STEP_SECONDS
from drape.model import build_model, build_noise_scheduler, diffusion_target

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
    checkpoint_stall_seconds: float = 0.0  # time the loop blocked in sharded checkpoint saves
    ranks: list[dict] = field(default_factory=list)  # per rank: partitions, shards, samples held, data-wait

    @property
    def data_wait_fraction(self) -> float:
        return self.data_wait_seconds / self.train_seconds if self.train_seconds else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "data_wait_fraction": self.data_wait_fraction}


def resolve_device(requested: str) -> torch.device:
    """'auto' picks CUDA when present; asking for 'cuda' without a GPU is an error."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device is 'cuda' but no CUDA device is available")
    return torch.device("cuda" if requested != "cpu" and torch.cuda.is_available() else "cpu")


def step_generator(seed: int, stage: str, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + STAGES.index(stage) * 100_003 + step)


class BatchPrefetcher:
    """Builds this rank's rows of the batch of step i+1.. in a thread while step i runs; measures time blocked.

    Each step draws B/P indices into every data partition from the step's generator, in partition
    order (every rank draws all of them, so the generator is in the same state on every rank and
    world size), and keeps the rows of the partitions this rank holds. With one partition this is
    a plain uniform draw of B indices over the stage.
    """

    def __init__(self, data: StageData, owned: range, *, seed: int, stage: str, batch_size: int, start: int, stop: int,
                 depth: int = 2):
        data.check_holds(owned)
        self.data, self.owned, self.seed, self.stage = data, owned, seed, stage
        self.rows = batch_size // data.count
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._fill, args=(start, stop), daemon=True)
        self.thread.start()
        self.wait_seconds = 0.0

    def _fill(self, start: int, stop: int) -> None:
        try:
            for step in range(start, stop):
                generator = step_generator(self.seed, self.stage, step)
                drawn = [torch.randint(0, size, (self.rows,), generator=generator).numpy() for size in self.data.sizes]
                parts = [to_model_inputs(self.data.partitions[p], drawn[p]) for p in self.owned]
                batch = parts[0] if len(parts) == 1 else {k: torch.cat([part[k] for part in parts]) for k in parts[0]}
                self.queue.put((step, batch, generator))
        except BaseException as error:  # surfaced by next(), not lost in the thread
            self.error = error
            self.queue.put(None)

    def next(self):
        started = time.perf_counter()
        item = self.queue.get()
        waited = time.perf_counter() - started
        if item is None:
            raise RuntimeError(f"stage {self.stage}: building a batch failed: {self.error}") from self.error
        self.wait_seconds += waited
        return item, waited


def _configure_trainable(model: torch.nn.Module, patterns: list[str]) -> list[str]:
    names = trainable_parameter_names(patterns, [name for name, _ in model.named_parameters()])
    if not names:
        raise ValueError(f"train.stages: trainable patterns {patterns} match no model parameter")
    chosen = set(names)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in chosen)
    return names


def train_stage(config: PipelineConfig, *, stage: str, data: StageData | dict, out_dir: str | Path, init_checkpoint: str | Path | None,
                mode: str = "full", data_manifest_hash: str = "", log_metrics: MetricsSink | None = None,
                progress: Callable[[int, int], None] | None = None, metric_labels: dict[str, str] | None = None,
                context: DistContext | None = None) -> TrainResult:
    """Train `stage` on `data`, checkpointing under `out_dir`/checkpoints.

    `data` is this rank's `StageData` (`load_stage_data`), or arrays as `load_split` gives them,
    held whole and dealt into the data partitions by sample.

    Starts from `init_checkpoint` (or fresh weights), or resumes from the newest checkpoint already
    in `out_dir`. `mode` 'full' runs the stage's `steps`, 'finetune' its `finetune_steps`.
    Every step's data-wait and duration go to the Prometheus histograms ``drape_data_wait_seconds``
    and ``drape_train_step_seconds`` labelled `metric_labels` (run, stage) and the rank.
    """
    stage_config, train = config.train.stages[stage], config.train
    if mode not in ("full", "finetune"):
        raise ValueError(f"mode must be 'full' or 'finetune', got {mode!r}")
    context = context or DistContext(device=resolve_device(train.device))
    partitions = resolve_partitions(train.data_partitions, context.world_size, train.batch_size)
    if isinstance(data, dict):
        data = StageData.whole(data, partitions)
    if data.count != partitions:
        raise ValueError(f"stage {stage}: data is dealt into {data.count} partitions, the run uses {partitions}")
    total = stage_config.steps if mode == "full" else stage_config.finetune_steps
    checkpoints_dir = Path(out_dir) / "checkpoints"
    existing = list_checkpoints(checkpoints_dir)
    resume_from = existing[-1] if existing else None
    sharded_resume = resume_from is not None and resume_from.name.endswith(DCP_SUFFIX)
    source = init_checkpoint if sharded_resume or resume_from is None else resume_from
    device = context.device
    model = (load_model(source) if source else build_model(config)).to(device)
    if train.gradient_checkpointing:
        model.transformer.enable_gradient_checkpointing()
    names = _configure_trainable(model, stage_config.trainable)
    model = wrap_model(model, context, train.parallelism, bf16=train.precision == "bf16")
    parameters = dict(unwrap(model).named_parameters())
    optimizer = torch.optim.AdamW([parameters[n] for n in names], lr=stage_config.lr or train.lr, weight_decay=train.weight_decay)
    start_step, ema = 0, None
    if train.ema.enabled:
        ema = {n: parameters[n].detach().clone() for n in names}
    if sharded_resume:
        load_sharded(resume_from, model, optimizer, ema)
        start_step = checkpoint_step(resume_from)
    elif resume_from is not None:
        restored = load_training_state(resume_from, optimizer, names)
        if train.ema.enabled and restored is not None:
            ema = {n: restored[n].to(device) for n in names}
        start_step = checkpoint_step(resume_from)
    scheduler = build_noise_scheduler(config.diffusion)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=train.precision == "bf16")
    prefetcher = BatchPrefetcher(data, rank_partitions(partitions, context.world_size, context.rank), seed=config.seed,
                                 stage=stage, batch_size=train.batch_size, start=start_step, stop=total)
    manifest_base = {"config": config.model_dump(mode="json"), "stage": stage, "mode": mode, "total_steps": total,
                     "data_manifest_hash": data_manifest_hash}
    labels = {"run": "", "stage": stage, **(metric_labels or {}), "rank": str(context.rank)}
    data_wait, step_time = DATA_WAIT.labels(**labels), STEP_SECONDS.labels(**labels)
    local = context.local_slice(train.batch_size)
    sharded = ShardedCheckpointer(context, use_async=train.async_checkpoint) if context.is_distributed else None
    loss_value, started, checkpoint = float("nan"), time.perf_counter(), resume_from
    model.train()
    for _ in range(start_step, total):
        (step, batch, generator), waited = prefetcher.next()
        step_started = time.perf_counter()
        global_shape = (train.batch_size, *batch["target"].shape[1:])  # the batch holds this rank's rows only
        noise = torch.randn(global_shape, generator=generator)[local].to(device)  # the global batch's noise, this rank's rows
        timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (train.batch_size,), generator=generator)[local].to(device)
        batch = {k: v.to(device) for k, v in batch.items()}
        noisy = scheduler.add_noise(batch["target"], noise, timesteps)
        with autocast:
            prediction = model(noisy, timesteps, batch["agnostic"], batch["mask"], batch["pose"], batch["garment"])
        loss = F.mse_loss(prediction.float(), diffusion_target(scheduler, batch["target"], noise, timesteps))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([parameters[n] for n in names], train.grad_clip)
        optimizer.step()
        if ema is not None:
            with torch.no_grad():
                for n in names:
                    ema[n].lerp_(parameters[n].detach(), 1 - train.ema.decay)
        loss_value, done = _global_mean(loss.detach(), context), step + 1
        step_seconds = time.perf_counter() - step_started
        data_wait.observe(waited)
        step_time.observe(step_seconds + waited)
        if log_metrics and context.is_main and (done % train.log_every == 0 or done == total):
            log_metrics({f"{stage}/loss": loss_value, f"{stage}/step_seconds": step_seconds + waited,
                         f"{stage}/data_wait_seconds": waited,
                         f"{stage}/samples_per_second": train.batch_size / max(step_seconds + waited, 1e-9)}, done)
        step_manifest = {**manifest_base, "step": done, "loss": loss_value}
        if sharded is not None and done != total and done % train.checkpoint_every == 0:
            sharded.save(checkpoints_dir / f"{checkpoint_name(done)}{DCP_SUFFIX}", model, optimizer, ema, step_manifest)
        elif done == total or (sharded is None and done % train.checkpoint_every == 0):
            if sharded is not None:
                sharded.wait()
            checkpoint = _save_full(checkpoints_dir / checkpoint_name(done), config, model, optimizer, names, ema, step_manifest,
                                    context, with_optimizer=train.parallelism != "fsdp" or not context.is_distributed)
        if progress and context.is_main:
            progress(done, total)
    if checkpoint is None:
        raise RuntimeError(f"stage {stage}: nothing to train ({total} steps) and no checkpoint to resume from")
    seconds = time.perf_counter() - started
    trained = total - start_step
    ranks = _per_rank(context, {"rank": context.rank, "partitions": list(prefetcher.owned),
                                "shards": [path for p in prefetcher.owned for path in data.shards.get(p, [])],
                                "samples": sum(len(data.partitions[p]["keys"]) for p in prefetcher.owned),
                                "data_wait_seconds": prefetcher.wait_seconds,
                                "data_wait_fraction": prefetcher.wait_seconds / seconds if seconds else 0.0})
    if log_metrics and context.is_main and trained:
        log_metrics({f"{stage}/data_wait_fraction/rank{r['rank']}": r["data_wait_fraction"] for r in ranks}, total)
    return TrainResult(stage, total, start_step, loss_value, str(checkpoint), seconds, prefetcher.wait_seconds,
                       trained * train.batch_size / seconds if seconds else 0.0,
                       sharded.stall_seconds if sharded is not None else 0.0, ranks)


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
        torch.distributed.all_reduce(loss, op=torch.distributed.ReduceOp.AVG if context.device.type == "cuda"
                                     else torch.distributed.ReduceOp.SUM)
        if context.device.type != "cuda":  # gloo has no AVG
            loss /= context.world_size
    return float(loss)


def _save_full(path: Path, config: PipelineConfig, model, optimizer, names: list[str], ema: dict | None, manifest: dict,
               context: DistContext, with_optimizer: bool) -> Path:
    """The safetensors checkpoint (rank 0 writes it; the whole model gathered under FSDP)."""
    plain = unwrap(model)
    if context.is_distributed and config.train.parallelism == "fsdp":
        state = full_model_state(model)  # collective: every rank takes part, rank 0 receives the whole state
        ema = {n: t.full_tensor() if hasattr(t, "full_tensor") else t for n, t in ema.items()} if ema is not None else None
        if context.is_main:
            plain = build_model(config)
            plain.load_state_dict(state)
    if context.is_main:
        save_checkpoint(path, model=plain, optimizer=optimizer if with_optimizer else None, trainable_names=names, ema=ema,
                        manifest=manifest)
    context.barrier()
    return path


def peak_memory_gib(device: torch.device) -> float:
    """Peak GPU memory of this process (`torch.cuda.max_memory_allocated`); on CPU its peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _write_json(path: str | Path, payload: dict) -> None:
    import json
    import os

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(payload, indent=2))
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    """Train one stage from the command line, with no orchestrator: data is fetched and verified first.

    As a queue job (the pipeline's train task) it also logs to the stage's MLflow run
    (`--mlflow-run`), labels and pushes its Prometheus series (`--run-id`), and writes its result
    with the measured peak memory to `--result` and to $DRAPE_JOB_RESULT.
    """
    import json
    import os
    import sys

    from drape.config import load_config
    from drape.data.cache import ShardCache
    from drape.data.dataset import dataset_prefix, ensure_dataset, manifest_hash
    from drape.data.partition import load_stage_data
    from drape.metrics import push_metrics
    from drape.storage import open_store

    parser = argparse.ArgumentParser(prog="python -m drape.train", description=main.__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--stage", required=True, choices=STAGES)
    parser.add_argument("--out", default=None, help="stage directory (default <root>/live/runs/manual/<stage>)")
    parser.add_argument("--init", default=None, help="checkpoint to start from")
    parser.add_argument("--mode", default="full", choices=("full", "finetune"))
    parser.add_argument("--result", default=None, help="write the result (JSON) here")
    parser.add_argument("--mlflow-run", default=None, help="MLflow run id to log metrics to")
    parser.add_argument("--run-id", default="manual", help="pipeline run id for metric labels")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    context = init_from_env(config.train.device)  # torchrun: joins the process group; else one process
    store = open_store(config)
    manifest = ensure_dataset(config, store) if context.is_main else None
    if context.is_distributed:  # rank 0 made sure the dataset exists; the others read its manifest
        holder = [manifest]
        torch.distributed.broadcast_object_list(holder, src=0)
        manifest = holder[0]
    cache = ShardCache.from_config(config, store, dataset_prefix(config), manifest)
    partitions = resolve_partitions(config.train.data_partitions, context.world_size, config.train.batch_size)
    # each rank fetches (if not pre-staged already) and reads only its own partitions' shards
    data = load_stage_data(cache, args.stage, partitions=partitions, world_size=context.world_size, rank=context.rank)
    context.barrier()
    out = Path(args.out) if args.out else config.paths.root_path / "live" / "runs" / "manual" / args.stage
    sink = None
    if args.mlflow_run:
        from drape.tracking import Tracker

        tracker = Tracker(config)
        sink = lambda metrics, step: tracker.log_metrics(args.mlflow_run, metrics, step)  # noqa: E731

    def progress(done: int, total: int) -> None:  # rank 0 only (train_stage)
        if done == total or done % max(total // 10, 1) == 0:
            print(f"train-{args.stage}: step {done}/{total} ({100 * done // total}%)", flush=True)

    result = train_stage(config, stage=args.stage, data=data, out_dir=out, init_checkpoint=args.init, mode=args.mode,
                         data_manifest_hash=manifest_hash(manifest), log_metrics=sink, progress=progress,
                         metric_labels={"run": args.run_id, "stage": args.stage}, context=context)
    if context.is_distributed:
        torch.distributed.destroy_process_group()
    # every rank pushes its own series (data-wait and step time per rank), in a group of its own
    push_metrics(config, grouping={"run": args.run_id, "stage": args.stage, "rank": str(context.rank)})
    if not context.is_main:
        return 0
    payload = {**result.to_dict(), "peak_memory_gib": peak_memory_gib(context.device), "world_size": context.world_size,
               "shard_read_wait_seconds": cache.read_wait_seconds}
    for path in filter(None, (args.result, os.environ.get("DRAPE_JOB_RESULT"))):
        _write_json(path, payload)
    print(f"train-{args.stage}: done, final loss {result.final_loss:.4f}, checkpoint {result.checkpoint}", file=sys.stderr)
    print(json.dumps(payload))  # the last line of stdout: the result, for scripts
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
