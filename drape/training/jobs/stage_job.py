"""One StageJob: the one way a stage trains, in the pipeline's process or as a queue job.

A `StageJob` names the stage, the mode, the run it belongs to and where it writes. `run()`
reads the dataset manifest, deals the stage's shards to this rank's data partitions, fetches
whichever of this rank's shards are not in the node's shard cache yet (none, when the pipeline
pre-staged them) and trains. In the pipeline it runs in-process with the run's store, cache and
tracker. As a queue job it runs apart, on a node that shares nothing with the flow's but the
object store (`handoff`): the pipeline publishes it to the store (`publish`) and the job runs
``python -m drape.train --job <store URL>`` (`main`), which reads it back unchanged (`read`),
takes its starting weights and the stage's newest checkpoint from the store, and publishes its
checkpoints and result there (drape/training/jobs/apart.py). With `paths.shared` (a volume every pod
mounts) the job file is ``job-config.json`` in the stage folder instead. Operators run the same
thing with ``python -m drape.train --config F --stage S``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from drape import MODES, STAGES, Mode, Stage, parse_mode, parse_stage
from drape.config import ConfigError, PipelineConfig, load_config, parse_config
from drape.data.cache import ShardCache
from drape.data.dataset import dataset_prefix, ensure_dataset, manifest_hash
from drape.data.partition import StageData, load_stage_data, resolve_partitions
from drape.gates.recognizers import ControlSetError
from drape.jsonfile import parse_json, read_json
from drape.layout import MANUAL_RUN, LiveLayout, bases_dir, checkpoint_step, live_root
from drape.ops.logsink import tolerate_full_disks
from drape.ops.metrics import push_metrics
from drape.ops.process import end_without_collection
from drape.secrets import redact
from drape.storage.durable import publish_json
from drape.storage.handoff import job_key, newest_published, result_key
from drape.storage.progress import ProgressReporter
from drape.storage.store import ObjectStore, open_store, remove_tree
from drape.training.jobs.apart import CheckpointPublisher, NextStageWarmer, align_to, fetch_init, restore_newest
from drape.training.jobs.lock import stage_lock
from drape.training.loop import stop
from drape.training.loop.distributed import DistContext, disk_leader, init_from_env
from drape.training.loop.state import resume_point
from drape.training.loop.trainer import TrainResult, peak_memory_gib, resolve_device, train_stage

JOB_SCHEMA = "drape.stage_job/v1"


@dataclass(frozen=True)
class StageJobResult:
    train: TrainResult
    shard_read_wait_seconds: float  # time reading blocked on a shard that was not local yet
    peak_memory_gib: float
    world_size: int
    node: str = ""  # the host it trained on
    warmed: dict | None = None  # the next stage's shards this node pre-staged while it trained (run apart)

    def to_dict(self) -> dict:
        return {
            **self.train.to_dict(),
            "peak_memory_gib": self.peak_memory_gib,
            "world_size": self.world_size,
            "shard_read_wait_seconds": self.shard_read_wait_seconds,
            "node": self.node,
            "warmed": self.warmed,
        }

    @classmethod
    def from_dict(cls, payload: dict) -> StageJobResult:
        return cls(
            TrainResult.from_dict(payload),
            payload.get("shard_read_wait_seconds", 0.0),
            payload.get("peak_memory_gib", 0.0),
            payload.get("world_size", 1),
            str(payload.get("node", "")),
            payload.get("warmed"),
        )


@dataclass(frozen=True)
class StageJob:
    config: PipelineConfig
    stage: Stage
    out_dir: Path
    mode: Mode = Mode.FULL
    init_checkpoint: str | None = None
    run_id: str = MANUAL_RUN
    mlflow_run: str | None = None  # the stage's MLflow run, when it belongs to a pipeline run
    handoff: bool = False  # runs apart from the flow: everything it takes and gives goes through the store
    init_key: str | None = None  # run apart: the store prefix of the published weights it starts from

    def __post_init__(self) -> None:  # the one place stage, mode and (run apart) the stage folder are checked
        object.__setattr__(self, "stage", parse_stage(self.stage))
        object.__setattr__(self, "mode", parse_mode(self.mode))
        if self.handoff:  # a node's own folder for the stage, whatever the job file says
            object.__setattr__(self, "out_dir", LiveLayout(live_root(self.config)).stage(self.run_id, self.stage).root)
        object.__setattr__(self, "out_dir", Path(self.out_dir))

    @classmethod
    def manual(cls, config: PipelineConfig, stage: str, **fields) -> StageJob:
        """A job outside any pipeline run, in ``runs/manual/<stage>`` unless `out_dir` is given."""
        out_dir = fields.pop("out_dir", None) or LiveLayout(live_root(config)).stage(MANUAL_RUN, stage).root
        return cls(config, parse_stage(stage), out_dir, **fields)

    # --- as a queue job: one file, read back as it was written --------------------------------
    def to_dict(self) -> dict:
        return {
            "schema": JOB_SCHEMA,
            "config": self.config.model_dump(mode="json"),
            "stage": self.stage,
            "mode": self.mode,
            "out_dir": str(self.out_dir),
            "init_checkpoint": self.init_checkpoint,
            "run_id": self.run_id,
            "mlflow_run": self.mlflow_run,
            "handoff": self.handoff,
            "init_key": self.init_key,
        }

    def write(self, path: str | Path, *, result: str | Path | None = None) -> list[str]:
        """Write the job to `path` (atomically) and return the command that runs it (writing its
        result to `result`)."""
        publish_json(path, self.to_dict())
        return [sys.executable, "-m", "drape.train", "--job", str(path), *(["--result", str(result)] if result else [])]

    def publish(self, store: ObjectStore) -> list[str]:
        """Publish the job to the object store (run apart) and return the command that runs it on any node."""
        key = job_key(self.run_id, self.stage)
        store.put_bytes(json.dumps(self.to_dict(), indent=2).encode(), key)
        endpoint = self.config.storage.endpoint_url
        command = [sys.executable, "-m", "drape.train", "--job", store.key_url(key)]
        return command + (["--store-endpoint", endpoint] if endpoint else [])

    @classmethod
    def read(cls, path: str | Path, *, endpoint_url: str | None = None) -> StageJob:
        """The job in a file, or at an object store URL (``s3://…/job.json``, with `endpoint_url`)."""
        where = str(path)
        if "://" in where and not where.startswith("file://"):
            folder, name = where.rsplit("/", 1)
            payload = parse_json(ObjectStore(folder, endpoint_url=endpoint_url).read_bytes(name), where, "stage job")
        else:
            payload = read_json(where.removeprefix("file://"), "stage job")
        if not isinstance(payload, dict) or payload.get("schema") != JOB_SCHEMA:
            schema = payload.get("schema") if isinstance(payload, dict) else None
            raise ValueError(f"{where}: not a drape stage job (schema {schema!r}, expected {JOB_SCHEMA!r})")
        names = ("stage", "mode", "out_dir", "init_checkpoint", "run_id", "mlflow_run")
        if missing := [name for name in (*names, "config") if name not in payload]:
            raise ValueError(f"{where}: the stage job lacks {', '.join(missing)}")
        fields = {k: payload[k] for k in names} | {k: payload[k] for k in ("handoff", "init_key") if k in payload}
        return cls(parse_config(payload["config"], where), **fields)

    # --- running it -------------------------------------------------------------------------------
    def run(
        self,
        *,
        context: DistContext | None = None,
        cache: ShardCache | None = None,
        tracker=None,
        progress: Callable[[int, int], None] | None = None,
    ) -> StageJobResult:
        """Train the stage on this rank's shards. `cache` and `tracker` are the run's when the
        pipeline runs the job in its own process; otherwise they are built here."""
        context = context or DistContext(device=resolve_device(self.config.train.device))
        store = open_store(self.config) if self.handoff else None
        progress = self._reporting(store, context, progress)  # rank 0 tells the queue's watchdog: now, then per step
        cache = cache or self._cache(context)
        # run apart: the first process of each disk (probed when the job spans nodes) fetches, restores and frees
        leader = (
            disk_leader(context, self.out_dir.parent) if store is not None and _across_nodes(context) else context.local_rank == 0
        )
        init = self._take_from_store(store, context, leader) if store is not None else self.init_checkpoint
        read_wait_before = cache.read_wait_seconds
        partitions = resolve_partitions(self.config.train.data_partitions, context.world_size, self.config.train.batch_size)
        # each rank fetches (if not pre-staged already) and reads only its own partitions' shards
        data = load_stage_data(cache, self.stage, partitions=partitions, world_size=context.world_size, rank=context.rank)
        context.barrier()
        warmer = publisher = None
        if store is not None and leader:  # one per disk
            warmer = NextStageWarmer(cache, self.stage)
            publisher = CheckpointPublisher(store, self.config.retention, run_id=self.run_id, stage=self.stage)
        # one live trainer per stage directory; no shard may be evicted under the reader while it trains
        with stage_lock(self.out_dir, hold=context.is_main), cache.pin([self.stage]):
            try:
                result = self._train(data, context, cache.manifest, tracker, progress, init, publisher)
            except stop.StopRequested as stopped:  # every rank, at the same step
                if publisher is not None:
                    publisher.close(raise_errors=False)
                context.barrier()  # every node's shards published (or given up on)
                if context.is_main:
                    self._say_published(stopped, store)
                raise
            except BaseException:
                if publisher is not None:
                    publisher.close(raise_errors=False)  # what was saved is published: a retry resumes from it
                raise
            if publisher is not None:
                publisher.close(final=Path(result.checkpoint))
        job_result = StageJobResult(
            result,
            cache.read_wait_seconds - read_wait_before,
            peak_memory_gib(context.device),
            context.world_size,
            os.environ.get("DRAPE_NODE") or socket.gethostname(),  # the queue's name for the node, where it set one
            warmer.summary() if warmer is not None else None,
        )
        if store is not None:
            self._give_back(store, job_result, context, leader)
        return job_result

    def _reporting(self, store: ObjectStore | None, context: DistContext, progress):
        """Run apart, on rank 0: `progress` and a report through the store (drape/storage/progress.py), one now."""
        stall = self.config.queue.stall_timeout_seconds
        if store is None or not context.is_main or stall is None:
            return progress
        report = ProgressReporter(store, self.run_id, self.stage, interval=min(stall / 4, 30.0), run=stop.run_mark())
        report(0, 0, force=True)

        def both(done: int, total: int) -> None:
            if progress is not None:
                progress(done, total)
            report(done, total)

        return both

    def _say_published(self, stopped: stop.StopRequested, store: ObjectStore | None) -> None:
        newest = newest_published(store, self.run_id, self.stage) if store else resume_point(self.out_dir / "checkpoints")
        where = "the object store" if store is not None else str(self.out_dir)
        stop.say_stopped(stopped, checkpoint_step(newest) if newest else None, where, self.stage)

    def _take_from_store(self, store: ObjectStore, context: DistContext, leader: bool) -> str | None:
        """Run apart: the starting weights and the store's newest checkpoint onto this node (one
        process per node fetches, the others wait); the local path of the starting weights."""
        across_nodes = _across_nodes(context)
        if across_nodes:  # every node from the checkpoint rank 0 finds newest and whole in the store
            chosen = [newest_published(store, self.run_id, self.stage) if context.is_main else None]
            torch.distributed.broadcast_object_list(chosen, src=0)
        if leader:
            bases = bases_dir(self.config, self.out_dir)  # the frozen base a fetched checkpoint names comes too
            if self.init_key:
                fetch_init(store, self.init_key, self.out_dir, bases=bases)
            if across_nodes:
                restored = align_to(store, self.run_id, self.stage, self.out_dir, chosen[0], bases=bases)
            else:
                restored = restore_newest(store, self.run_id, self.stage, self.out_dir, bases=bases)
            if restored is not None:
                print(f"train-{self.stage}: resuming from {restored.name}, fetched from the object store (verified)", flush=True)
        context.barrier()
        return str(self.out_dir / "init") if self.init_key else None

    def _give_back(self, store: ObjectStore, result: StageJobResult, context: DistContext, leader: bool) -> None:
        """Run apart: the result into the store, then this node's copy of the stage freed (all published)."""
        context.barrier()
        if context.is_main:
            store.put_bytes(json.dumps(result.to_dict()).encode(), result_key(self.run_id, self.stage))
            stop.say_finished(self.stage)  # a stop signal from now on meets a finished job
        if leader:
            remove_tree(self.out_dir)
        context.barrier()

    def _train(self, data: StageData, context: DistContext, manifest: dict, tracker, progress, init, on_saved) -> TrainResult:
        return train_stage(
            self.config,
            stage=self.stage,
            data=data,
            out_dir=self.out_dir,
            init_checkpoint=init,
            mode=self.mode,
            data_manifest_hash=manifest_hash(manifest),
            log_metrics=self._sink(tracker) if context.is_main else None,  # rank 0 logs: the others never load MLflow
            progress=progress,
            metric_labels={"run": self.run_id, "stage": self.stage},
            context=context,
            on_saved=on_saved,
        )

    def _cache(self, context: DistContext) -> ShardCache:
        """The node's shard cache for the config's dataset; rank 0 makes sure the dataset exists."""
        store = open_store(self.config)
        manifest = ensure_dataset(self.config, store) if context.is_main else None
        if context.is_distributed:  # the other ranks read rank 0's manifest
            holder = [manifest]
            torch.distributed.broadcast_object_list(holder, src=0)
            manifest = holder[0]
        if manifest is None:
            raise RuntimeError(f"rank {context.rank}: rank 0 sent no dataset manifest for {dataset_prefix(self.config)}")
        return ShardCache.from_config(self.config, store, dataset_prefix(self.config), manifest)

    def _sink(self, tracker):
        if self.mlflow_run is None:
            return None
        if tracker is None:
            from drape.ops.tracking import Tracker

            tracker = Tracker(self.config)
        return lambda metrics, step: tracker.log_metrics(self.mlflow_run, metrics, step)


def _across_nodes(context: DistContext) -> bool:
    return context.world_size > int(os.environ.get("LOCAL_WORLD_SIZE", context.world_size))


def progress_lines(stage: str) -> Callable[[int, int], None]:
    """Progress for logs: one line per tenth of the stage (``train-<stage>: step 30/300 (10%)``)."""

    def report(done: int, total: int) -> None:
        if done == total or done % max(total // 10, 1) == 0:
            print(f"train-{stage}: step {done}/{total} ({100 * done // total}%)", flush=True)

    return report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m drape.train", description=(main.__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--job", default=None, help="a stage job the pipeline wrote: a file or an object store URL (replaces the options below)"
    )
    parser.add_argument("--store-endpoint", default=None, help="the S3 endpoint of a --job URL (default: AWS's)")
    parser.add_argument("--config", default=None)
    parser.add_argument("--stage", default=None, choices=STAGES)
    parser.add_argument("--out", default=None, help="stage directory (default <root>/live/runs/manual/<stage>)")
    parser.add_argument(
        "--init",
        default=None,
        help="checkpoint to start from: a drape checkpoint, or CatVTON's release (a folder with attention/model.safetensors)",
    )
    parser.add_argument("--mode", default=Mode.FULL.value, choices=MODES)
    parser.add_argument("--result", default=None, help="write the result (JSON) here")
    parser.add_argument("--mlflow-run", default=None, help="MLflow run id to log metrics to")
    parser.add_argument("--run-id", default=MANUAL_RUN, help="pipeline run id for metric labels")
    return parser


def job_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> StageJob:
    if args.job:
        try:
            return StageJob.read(args.job, endpoint_url=args.store_endpoint)
        except (OSError, ValueError) as error:
            parser.exit(2, f"{parser.prog}: cannot read the job file {args.job}: {redact(str(error))}\n")
    if not args.config or not args.stage:
        parser.error("--config and --stage are required (or --job)")
    try:
        config = load_config(args.config)
    except ConfigError as error:
        parser.exit(2, f"{parser.prog}: config error\n{redact(str(error))}\n")
    return StageJob.manual(
        config,
        args.stage,
        out_dir=args.out,
        mode=args.mode,
        init_checkpoint=args.init,
        run_id=args.run_id,
        mlflow_run=args.mlflow_run,
    )


def main(argv: list[str] | None = None) -> int:
    """Train one stage from the command line, with no orchestrator: data is fetched and verified first.

    As a queue job (`--job`, or `--mlflow-run` and `--run-id`) it also logs to the stage's MLflow
    run, labels and pushes its Prometheus series, and writes its result with the measured peak
    memory to `--result` and to $DRAPE_JOB_RESULT. Under torchrun every rank runs this.
    """
    end_without_collection()
    tolerate_full_disks()  # a full disk under the job's log drops and counts lines, never ends the job
    parser = _parser()
    args = parser.parse_args(argv)
    job = job_from_args(args, parser)
    context = init_from_env(job.config.train.device)  # torchrun: joins the process group; else one process
    stop.install()  # SIGTERM / SIGUSR1: checkpoint, publish, exit EXIT_STOPPED (drape/training/loop/stop.py)
    try:
        result = job.run(context=context, progress=progress_lines(job.stage))
    except stop.StopRequested as stopped:
        if context.is_distributed:
            torch.distributed.destroy_process_group()
        print(f"train-{job.stage}: {stopped}; exiting", file=sys.stderr, flush=True)
        return stop.EXIT_STOPPED
    except ControlSetError as error:  # bad input (a control set the gate cannot judge): exit 2, no traceback
        print(f"drape: error: train-{job.stage}: {error}", file=sys.stderr, flush=True)
        return 2
    if context.is_distributed:
        torch.distributed.destroy_process_group()
    # every rank pushes its own series (data-wait and step time per rank), in a group of its own
    push_metrics(job.config, grouping={"run": job.run_id, "stage": job.stage, "rank": str(context.rank)})
    if not context.is_main:
        return 0
    payload = result.to_dict()
    for path in filter(None, (args.result, os.environ.get("DRAPE_JOB_RESULT"))):
        publish_json(path, payload)
    print(
        f"train-{job.stage}: done, final loss {result.train.final_loss:.4f}, checkpoint {result.train.checkpoint}",
        file=sys.stderr,
    )
    print(json.dumps(payload))  # the last line of stdout: the result, for scripts
    return 0
