"""A stage's training as a queue job: what the flow hands the job and takes back from it.

Apart (`PipelineConfig.trains_apart`, the default with the queue), the job runs on a node that
shares nothing with the flow's but the object store: the flow publishes the job and the weights it
starts from, and takes back the result and the candidate checkpoint, each verified
(drape/storage/handoff.py; the trainer's side: drape/training/jobs/apart.py). On a volume every pod
mounts (`paths.shared`), the job file and the result sit in the stage folder.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from drape import previous_stage
from drape.config import PipelineConfig
from drape.jsonfile import parse_json_object, read_json_object
from drape.layout import checkpoint_step
from drape.pipeline.run import RunContext, log_train_summary, resources
from drape.pipeline.stages import resume_checkpoint, stage_job, start_checkpoint
from drape.storage.bases import publish_bases
from drape.storage.handoff import baseline_weights_key, fetch_checkpoint, put_tree, result_key
from drape.training.jobs.stage_job import StageJobResult
from drape.training.loop.trainer import TrainResult


def train_command(config: PipelineConfig, context: RunContext, stage: str) -> list[str]:
    """The stage's training as a queue job: the command (`python -m drape.train --job …`). Apart
    (`trains_apart`), the job and the weights it starts from are published to the object store;
    on a shared volume (`paths.shared`) the job file is written in the stage folder."""
    paths = context.paths(stage)
    if not config.trains_apart:
        paths.train_result.unlink(missing_ok=True)
        resume_checkpoint(config, context, stage)
        return stage_job(config, context, stage).write(paths.job_config, result=paths.train_result)
    store = resources(config, context).store
    job = replace(stage_job(config, context, stage), handoff=True, init_checkpoint=None)
    return replace(job, init_key=_publish_start(store, context, stage)).publish(store)


def _publish_start(store, context: RunContext, stage: str) -> str | None:
    """The store key of the weights `stage` starts from (`start_checkpoint`), published once per baseline."""
    checkpoint = start_checkpoint(context, stage)
    if checkpoint is None:
        return None
    baseline = Path(checkpoint).parent
    record = read_json_object(baseline / "baseline.json", "baseline record") if (baseline / "baseline.json").is_file() else {}
    if not record.get("version") or not record.get("run_id"):
        raise FileNotFoundError(f"{baseline}/baseline.json: the live baseline has no registry record; restore it")
    key = baseline_weights_key(baseline.name, f"{record['version']}-{record['run_id']}")
    publish_bases(store, [checkpoint])  # the frozen base it names: the job's node fetches it with the tree
    put_tree(store, checkpoint, key)
    return key


def warm_node(config: PipelineConfig, context: RunContext, stage: str) -> str:
    """The node that trained the stage before `stage` in this run, whose cache it warmed with `stage`'s
    shards ('' for the first stage, or when unknown): the queue prefers it."""
    previous = previous_stage(stage)
    store = resources(config, context).store
    if not config.trains_apart or previous is None or not store.exists(result_key(context.run_id, previous)):
        return ""
    return str(parse_json_object(store, result_key(context.run_id, previous), "stage job result").get("node", ""))


def finish_train(config: PipelineConfig, context: RunContext, stage: str) -> TrainResult:
    """The TrainResult the stage's queue job wrote; logs the stage summary. Apart, the result and
    the candidate checkpoint come from the object store (verified) into this node's stage folder."""
    if config.trains_apart:
        result = _fetch_result(config, context, stage)
    else:
        path = context.paths(stage).train_result
        if not path.is_file():
            raise RuntimeError(f"stage {stage}: the train job ended without writing {path}")
        result = StageJobResult.from_dict(read_json_object(path, "stage job result"))
        path.unlink()
        context.paths(stage).job_config.unlink(missing_ok=True)
    log_train_summary(config, context, stage, result)  # its window: the queue's allocation
    return result.train


def train_result_ready(config: PipelineConfig, context: RunContext, stage: str) -> bool:
    """Whether the stage's queue job left the result `finish_train` takes (in the object store apart,
    else in the stage folder, until `finish_train` took it)."""
    if config.trains_apart:
        return resources(config, context).store.exists(result_key(context.run_id, stage))
    return context.paths(stage).train_result.is_file()


def _fetch_result(config: PipelineConfig, context: RunContext, stage: str) -> StageJobResult:
    store = resources(config, context).store
    key = result_key(context.run_id, stage)
    if not store.exists(key):
        raise RuntimeError(f"stage {stage}: the train job ended without publishing {store.key_url(key)}")
    try:
        result = StageJobResult.from_dict(parse_json_object(store, key, "stage job result"))
        name = Path(result.train.checkpoint).name
        checkpoint_step(name)  # a checkpoint's name, nothing else: the result is input
    except (ValueError, TypeError, KeyError) as error:
        raise RuntimeError(f"{store.key_url(key)}: not a stage job result ({error})") from None
    local = fetch_checkpoint(store, context.run_id, stage, name, context.paths(stage).checkpoints, bases=context.layout.bases)
    result.train.checkpoint = str(local)
    return result
