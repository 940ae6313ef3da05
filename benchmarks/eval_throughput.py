"""`drape eval` throughput (samples/s) against sampling alone, on CPU with the tiny model, and a
projection for VITON-HD's 2,032 test pairs at 1024×768 with the catvton recipe on one H100.

Both sides sample the same tiny model (`build_model` of tests/configs/tiny.yaml, 32 px, DDPM 6
steps) on the same `--samples` control samples, `--batch` at a time, with the same seed:

- eval: `drape.eval.runner.evaluate` as `drape eval` runs it: samples read and decoded from the
  shards, sampled, per-sample SSIM and LPIPS and both sides' Inception features (small stand-in
  feature networks: a TorchScript conv net and a random AlexNet), each batch persisted, then FID
  and KID through torchmetrics. A fresh directory each repeat (no batch reused).
- sampling: a bare loop of `drape.training.recipes.model.sample` over the same batches already decoded
  in memory: the floor any evaluation pays.
- resumed: `evaluate` again over a directory that holds every batch (a finished run restarted).

Medians over `--repeats` runs, alternating which side goes first. The projection for the real
job uses the field's published latency (CatVTON: 9.25 s per 1024×768 try-on on an A100, 50
steps) scaled to an H100 by an assumed speed-up (stated in the table), and the eval overhead
measured here on top of sampling; sampling is compute-bound (two concurrent requests overlap
< 7%), so batching does not change the per-sample time much.

    .venv/bin/python benchmarks/eval_throughput.py            # about 1 min on 2 CPU cores (OMP_NUM_THREADS=1)
    .venv/bin/python benchmarks/eval_throughput.py --samples 128 --repeats 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from drape.config import PipelineConfig, deep_merge, load_config, parse_config  # noqa: E402
from drape.data.dataset import build_dataset, to_model_inputs  # noqa: E402
from drape.data.reader import ShardIndex  # noqa: E402
from drape.eval.features import FeatureNetworks, load_inception, load_lpips  # noqa: E402
from drape.eval.runner import build_protocol, evaluate  # noqa: E402
from drape.training.recipes.model import build_model, sample  # noqa: E402
from tests.unit.test_eval_metrics import write_alexnet_weights, write_tiny_inception  # noqa: E402

VITON_TEST_PAIRS = 2032
CATVTON_A100_SECONDS = 9.25  # per 1024×768 try-on, 50 steps (CatVTON paper; DESIGN.md)
H100_SPEEDUPS = {"none (A100 pace)": 1.0, "typical for diffusion inference": 2.0, "bf16 peak ratio (989 / 312 TFLOPS)": 3.17}


def tiny_config(root: Path, samples: int, batch: int) -> PipelineConfig:
    path = REPO / "tests" / "configs" / "tiny.yaml"
    raw = load_config(path).model_dump(mode="json", by_alias=True)
    patch = {
        "paths": {"root": str(root)},
        "data": {"control_samples": samples, "shard_max_samples": 64},
        "eval": {"batch_size": batch},
    }
    return parse_config(deep_merge(raw, patch), str(path))


def time_eval(config, model, index, networks, protocol, root: Path) -> float:
    out = root / "eval-fresh"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    evaluate(config, model, index, networks, protocol=protocol, out_dir=out)
    return time.perf_counter() - start


def time_resumed(config, model, index, networks, protocol, root: Path) -> float:
    out = root / "eval-kept"
    evaluate(config, model, index, networks, protocol=protocol, out_dir=out)  # every batch on disk
    start = time.perf_counter()
    result = evaluate(config, model, index, networks, protocol=protocol, out_dir=out)
    assert result["resumed_batches"] == -(-protocol["samples"] // config.eval.batch_size)
    return time.perf_counter() - start


def time_sampling(config, model, batches: list[dict], seed: int, batch: int) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        for number, inputs in enumerate(batches):
            sample(model, config.diffusion, inputs, seed=seed, first_index=number * batch)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="drape-eval-bench-") as scratch:
        root = Path(scratch)
        config = tiny_config(root / "drape", args.samples, args.batch)
        manifest = build_dataset(config, root / "shards")
        index = ShardIndex([root / "shards" / shard["path"] for shard in manifest["splits"]["control"]])
        networks = FeatureNetworks(
            load_inception(str(write_tiny_inception(root / "inception.pt"))),
            load_lpips(str(write_alexnet_weights(root / "alexnet.pth"))),
        )
        model = build_model(config).eval()
        protocol = build_protocol(
            config, dataset="synth", source="synthetic", split="control", mode="paired", num_samples=args.samples, model="tiny"
        )
        fields = (*index.model_fields, "meta")
        batches = [
            to_model_inputs(index.take(range(s, min(s + args.batch, args.samples)), fields))
            for s in range(0, args.samples, args.batch)
        ]
        evaluate_s, sampling_s = [], []
        for repeat in range(args.repeats):
            order = [0, 1] if repeat % 2 == 0 else [1, 0]
            for side in order:
                if side == 0:
                    evaluate_s.append(time_eval(config, model, index, networks, protocol, root))
                else:
                    sampling_s.append(time_sampling(config, model, batches, protocol["seed"], args.batch))
        resumed = statistics.median(time_resumed(config, model, index, networks, protocol, root) for _ in range(3))
        index.close()
    report(args, statistics.median(evaluate_s), statistics.median(sampling_s), resumed)


def report(args, evaluate_s: float, sampling_s: float, resumed_s: float) -> None:
    n = args.samples
    print(
        f"\n{n} samples at 32 px, batch {args.batch}, DDPM 6 steps, CPU ({torch.get_num_threads()} threads); "
        f"medians of {args.repeats}"
    )
    print(f"{'':34s} {'seconds':>9s} {'samples/s':>10s}")
    for name, seconds in (
        ("drape eval (fresh)", evaluate_s),
        ("sampling alone", sampling_s),
        ("drape eval (resumed, all kept)", resumed_s),
    ):
        print(f"{name:34s} {seconds:9.3f} {n / seconds:10.1f}")
    overhead = evaluate_s / sampling_s - 1
    print(f"ratio eval / sampling: {evaluate_s / sampling_s:.3f} (eval's own work: {overhead:+.1%} of sampling at this size)")
    print(f"\nprojection: VITON-HD test, {VITON_TEST_PAIRS} pairs at 1024×768, catvton recipe (50 steps) on one H100")
    print("(assumed, not measured here: the eval's own work there, Inception and AlexNet per image, is small next to sampling)")
    print(f"{'H100 speed-up over the A100 (assumed)':48s} {'s/sample':>9s} {'samples/s':>10s} {'hours':>7s}")
    for label, speedup in H100_SPEEDUPS.items():
        seconds = CATVTON_A100_SECONDS / speedup
        print(f"{label:48s} {seconds:9.2f} {1 / seconds:10.3f} {VITON_TEST_PAIRS * seconds / 3600:7.2f}")
    print(
        "9.25 s is CatVTON's own setting; configs/catvton.yaml samples unguided (guidance_scale 1): "
        "a guided run adds a pass per step."
    )


if __name__ == "__main__":
    main()
