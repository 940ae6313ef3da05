"""One measurement of benchmarks/dataloader.py, in its own process: prints one JSON line.

Modes: memory (a 5-step training process, drape or the in-memory reader before), stream (drape,
webdataset or litdata reading a stage: samples/s, completion time of every batch, data-wait, peak
RSS of this process and of its largest worker), convert-litdata (the stage's shards as litdata
chunks, same PNG bytes).
"""

from __future__ import annotations

import gc
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

from drape.data.shards import MODEL_FIELDS, decode_member


def _peaks() -> dict:
    gc.collect()
    mib = lambda who: resource.getrusage(who).ru_maxrss / 1024  # noqa: E731 - KiB on Linux
    return {"peak_rss_mib": mib(resource.RUSAGE_SELF), "worker_peak_rss_mib": mib(resource.RUSAGE_CHILDREN)}


class Decoded:
    """The reader before: every sample of the stage decoded into memory up front."""

    model_fields = MODEL_FIELDS

    def __init__(self, index):
        self.arrays = index.take(range(len(index)))
        self.keys = list(self.arrays["keys"])

    def __len__(self) -> int:
        return len(self.keys)

    def prefetch(self, indices, fields=MODEL_FIELDS) -> None:
        pass  # in memory already

    def sample(self, index: int, fields=MODEL_FIELDS) -> dict:
        return {field: self.arrays[field][index] for field in fields} | {"key": self.keys[index]}


def memory(spec: dict) -> dict:
    from drape.config import load_config
    from drape.data.partition import StageData
    from drape.data.reader import ShardIndex
    from drape.training.jobs.stage_job import StageJob
    from drape.training.loop.distributed import DistContext
    from drape.training.loop.trainer import train_stage

    config = load_config(spec["config"])
    job = StageJob.manual(config, "identity", out_dir=spec["out"])
    if spec["reader"] == "drape":
        job.run()
    else:
        cache = job._cache(DistContext())
        cache.prestage("identity", keep=["control"])
        index = ShardIndex([cache.local_path(shard) for shard in cache.shards("identity")])
        data = StageData({0: Decoded(index)}, [len(index)])
        threaded = config.model_copy(
            update={"data": config.data.model_copy(update={"loader": config.data.loader.model_copy(update={"workers": 0})})}
        )
        train_stage(threaded, stage="identity", data=data, out_dir=spec["out"], init_checkpoint=None)
    return _peaks()


def _drape_batches(spec: dict):
    """drape's reader, created (its workers start) when this is called; a generator of (batch, wait)."""
    from drape.config import LoaderConfig
    from drape.data.partition import split_data
    from drape.training.loop.batches import BatchPrefetcher

    stage = Path(spec["dir"])
    data = split_data(stage, json.loads((stage / "manifest.json").read_text()), "identity")
    loader = LoaderConfig(workers=spec["workers"], prefetch_batches=max(4, 2 * spec["workers"]))
    prefetcher = BatchPrefetcher(
        data, range(1), seed=0, stage="identity", batch_size=spec["rows"], start=0, stop=spec["batches"], loader=loader
    )

    def batches():
        try:
            for _ in range(spec["batches"]):
                (_, batch, _), waited = prefetcher.next()
                yield batch, waited
        finally:
            prefetcher.close()

    return batches()


def _stack(samples: list[dict]) -> dict:
    return {name: np.stack([sample[name] for sample in samples]) for name in MODEL_FIELDS}


def _decode_wds(sample: dict) -> dict:
    shard = Path(sample["__url__"])
    return {name: decode_member(shard, f"{sample['__key__']}.{name}.png", sample[f"{name}.png"]) for name in MODEL_FIELDS}


def _webdataset_batches(spec: dict):
    import torch
    import webdataset as wds

    urls = sorted(str(path) for path in (Path(spec["dir"]) / "identity").glob("*.tar"))
    dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(_decode_wds)
    dataset = dataset.batched(spec["rows"], collation_fn=_stack).repeat()  # epochs until enough batches
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=spec["workers"], prefetch_factor=2)
    iterator = iter(loader)  # its workers start

    def batches():
        nonlocal iterator
        try:
            for _ in range(spec["batches"]):
                started = time.perf_counter()
                batch = next(iterator)
                yield batch, time.perf_counter() - started
        finally:
            del iterator  # its workers shut down

    return batches()


def _litdata_batches(spec: dict):
    from litdata import StreamingDataLoader, StreamingDataset

    class Decoding(StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            return {name: decode_member(Path("litdata"), f"{item['key']}.{name}.png", item[name]) for name in MODEL_FIELDS}

    dataset = Decoding(input_dir=str(Path(spec["dir"]) / "litdata"))
    loader = StreamingDataLoader(dataset, batch_size=spec["rows"], num_workers=spec["workers"], collate_fn=_stack)
    epoch = iter(loader)  # its workers start

    def batches():
        nonlocal epoch
        served = 0
        while True:
            started = time.perf_counter()
            for batch in epoch:  # epochs until enough batches
                yield batch, time.perf_counter() - started
                served += 1
                if served == spec["batches"]:
                    return
                started = time.perf_counter()
            epoch = iter(loader)

    return batches()


def convert_litdata(spec: dict) -> dict:
    from litdata import optimize
    from loader_shards import litdata_item, stage_items

    stage = Path(spec["dir"])
    optimize(fn=litdata_item, inputs=stage_items(stage), output_dir=str(stage / "litdata"), chunk_bytes="256MB", num_workers=1)
    return {}


_IMPORTS = {
    "drape": ["drape.training.loop.batches", "drape.data.partition"],
    "webdataset": ["torch", "webdataset"],
    "litdata": ["litdata"],
}


def _model_setup() -> None:
    """What a stage job does between creating its reader and its first step: build the model (that
    of configs/fitdit.yaml, 0.9 B parameters, on this CPU)."""
    from drape.config import EXAMPLE_SITE, load_config
    from drape.training.recipes.model import build_model

    build_model(load_config(Path(__file__).resolve().parents[1] / "configs" / "fitdit.yaml", site=EXAMPLE_SITE))


def stream(spec: dict) -> dict:
    """Times from the reader's creation, or with `setup` from the first request after the model
    build that follows the reader's creation (as `train_stage` orders them)."""
    import importlib

    for module in _IMPORTS[spec["reader"]]:  # a trainer has imported its reader before it creates one
        importlib.import_module(module)
    step_seconds = spec.get("step_seconds", 0.0)
    created = time.perf_counter()
    batches = {"drape": _drape_batches, "webdataset": _webdataset_batches, "litdata": _litdata_batches}[spec["reader"]](spec)
    setup_seconds = 0.0
    if spec.get("setup"):
        _model_setup()
        setup_seconds = time.perf_counter() - created
        created = time.perf_counter()
    done_at, waits, samples = [], [], 0
    for batch, wait in batches:
        samples += len(batch["target"])
        waits.append(wait)
        if step_seconds:
            time.sleep(step_seconds)  # the GPU's step: the host thread waits
        done_at.append(time.perf_counter() - created)
    steady_seconds = done_at[-1] - done_at[9]  # after the first 10 batches (their wait is part 4's warm-up)
    return {
        "samples_per_second": (samples - 10 * spec["rows"]) / steady_seconds,
        "done_at": done_at,
        "data_wait_fraction": sum(waits[10:]) / steady_seconds,
        "first_wait_seconds": waits[0],
        "first_ten_wait_seconds": sum(waits[:10]),
        "setup_seconds": setup_seconds,
        **_peaks(),
    }


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    result = {"memory": memory, "stream": stream, "convert-litdata": convert_litdata}[spec["mode"]](spec)
    print(json.dumps(result))
