"""A LoRA fine-tune pass vs a full fine-tune of the same layers, side by side, on one base.

Builds the config's dataset, trains the base as a run would (every stage up to `--stage`, full
mode), judges the base on the control set, then fine-tunes `--stage` from the base twice, each
its `finetune_steps`:

- full: the weights of the layers LoRA adapts (the nn.Linear layers the stage's `trainable`
  patterns select), every entry trained, AdamW moments for each;
- lora: rank `--rank` adapters on those layers (peft), the base frozen, merged at the end.

For each it prints the trainable parameters, the optimizer state (the AdamW moments a checkpoint
holds), the bytes of one intermediate checkpoint (what a resume needs), the median step time, and
the gate's values as a fine-tune pass is judged: against the base's outputs.

    .venv/bin/python benchmarks/lora_finetune.py                     # demo model, texture: ~6 minutes on 2 cores
    .venv/bin/python benchmarks/lora_finetune.py --stage denoise --rank 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from drape import STAGES, format_bytes, stage_index  # noqa: E402
from drape.config import deep_merge, load_config, parse_config  # noqa: E402
from drape.data.dataset import build_dataset, load_split, manifest_hash  # noqa: E402
from drape.data.partition import split_data  # noqa: E402
from drape.gates.run import evaluate_gate  # noqa: E402
from drape.layout import checkpoint_dirs  # noqa: E402
from drape.training.checkpoints.checkpoint import load_model, read_manifest  # noqa: E402
from drape.training.checkpoints.lora import lora_targets  # noqa: E402
from drape.training.loop.trainer import train_stage  # noqa: E402


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _finetune(config, stage: str, data, out: Path, base: str, digest: str) -> dict:
    seconds: list[float] = []

    def sink(metrics: dict, step: int) -> None:
        if f"{stage}/step_seconds" in metrics:  # the stage's end also reports per-rank data-wait
            seconds.append(metrics[f"{stage}/step_seconds"])

    started = time.perf_counter()
    result = train_stage(
        config,
        stage=stage,
        data=data,
        out_dir=out,
        init_checkpoint=base,
        mode="finetune",
        data_manifest_hash=digest,
        log_metrics=sink,
    )
    lora = config.train.lora.enabled
    saves = checkpoint_dirs(out / ("adapters" if lora else "checkpoints"))
    intermediate = saves[0]  # the first save at the cadence: what each checkpoint of the pass costs
    trainable = read_manifest(intermediate)["trainable"]
    model = load_model(base)
    if lora:
        from safetensors import safe_open

        with safe_open(str(intermediate / "adapter_model.safetensors"), framework="pt") as handle:
            parameters = sum(handle.get_slice(k).get_shape()[0] * handle.get_slice(k).get_shape()[1] for k in handle.keys())
    else:
        sizes = dict(model.named_parameters())
        parameters = sum(sizes[name].numel() for name in trainable)
    return {
        "result": result,
        "trainable": parameters,
        "optimizer_bytes": (intermediate / "optimizer.safetensors").stat().st_size,
        "checkpoint_bytes": _tree_bytes(intermediate),
        "step_seconds": statistics.median(seconds) if seconds else float("nan"),
        "wall": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "demo.yaml")
    parser.add_argument("--stage", default="texture", choices=[str(s) for s in STAGES])
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--lora-lr", type=float, default=None, help="default: 5× the stage's learning rate")
    parser.add_argument("--steps", type=int, default=None, help="fine-tune steps (default the stage's finetune_steps)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="drape-lora-bench-") as tmp:
        root = Path(tmp)
        base_config = load_config(args.config)
        raw = deep_merge(base_config.model_dump(mode="json", by_alias=True), {"paths": {"root": str(root / "drape")}})
        config = parse_config(raw, str(args.config))
        print(f"dataset: {config.data.name} at {config.data.resolution} px ...", flush=True)
        manifest = build_dataset(config, root / "shards")
        digest = manifest_hash(manifest)
        control = load_split(root / "shards", manifest, "control")
        base = None
        for stage in STAGES[: stage_index(args.stage) + 1]:
            print(f"base: {stage} ({config.train.stages[stage].steps} steps) ...", flush=True)
            trained = train_stage(
                config,
                stage=stage,
                data=split_data(root / "shards", manifest, stage),
                out_dir=root / "base" / stage,
                init_checkpoint=base,
                data_manifest_hash=digest,
            )
            base = trained.checkpoint
        assert base is not None
        stage, gate_args = args.stage, {"control": control, "control_set": digest[:12], "run_id": "bench"}
        evaluate_gate(config, stage=stage, checkpoint=base, gate_dir=root / "base-gate", **gate_args)

        targets = lora_targets(load_model(base), config.train.stages[stage].trainable)
        lr = config.train.stages[stage].lr or config.train.lr
        steps = args.steps or config.train.stages[stage].finetune_steps
        stage_patch = {"finetune_steps": steps, "trainable": [f"{t}.weight" for t in targets]}
        common = {"train": {"stages": {stage: stage_patch}}}
        lora = {"train": {"lora": {"enabled": True, "rank": args.rank, "lr": args.lora_lr or 5 * lr}}}
        variants = {"full": common, "lora": deep_merge(common, lora)}
        rows = {}
        data = split_data(root / "shards", manifest, stage)
        for name, patch in variants.items():
            variant = parse_config(deep_merge(raw, patch), str(args.config))
            print(f"{name} fine-tune of {len(targets)} layers, {steps} steps ...", flush=True)
            rows[name] = _finetune(variant, stage, data, root / name, base, digest)
            report = evaluate_gate(
                variant,
                stage=stage,
                checkpoint=rows[name]["result"].checkpoint,
                gate_dir=root / f"{name}-gate",
                baseline={"version": "base"},
                baseline_outputs_dir=root / "base-gate" / "outputs",
                **gate_args,
            )
            rows[name]["gate"] = report
        _print(rows, stage, len(targets), steps, args.rank)


def _print(rows: dict, stage: str, layers: int, steps: int, rank: int) -> None:
    full, lora = rows["full"], rows["lora"]
    print(f"\n{stage}: {layers} linear layers, {steps} steps; LoRA rank {rank}")
    print(f"{'':28}{'full fine-tune':>18}{'LoRA':>18}{'LoRA / full':>14}")

    def line(label: str, a: float, b: float, show) -> None:
        print(f"{label:28}{show(a):>18}{show(b):>18}{b / a if a else float('nan'):>14.3f}")

    line("trainable parameters", full["trainable"], lora["trainable"], lambda v: f"{v:,}")
    line("optimizer state", full["optimizer_bytes"], lora["optimizer_bytes"], format_bytes)
    line("one checkpoint save", full["checkpoint_bytes"], lora["checkpoint_bytes"], format_bytes)
    line("step time (median)", full["step_seconds"], lora["step_seconds"], lambda v: f"{v * 1000:.1f} ms")
    line("pass wall time", full["wall"], lora["wall"], lambda v: f"{v:.1f} s")
    line("final loss", full["result"].final_loss, lora["result"].final_loss, lambda v: f"{v:.4f}")
    for check in full["gate"].checks:
        a, b = full["gate"].checks[check], lora["gate"].checks[check]
        print(
            f"{'gate ' + check + ' (mean)':28}{a.mean:>18.3f}{b.mean:>18.3f}{b.mean / a.mean if a.mean else float('nan'):>14.3f}"
        )
    print(f"{'gate verdict':28}{full['gate'].verdict:>18}{lora['gate'].verdict:>18}")


if __name__ == "__main__":
    main()
