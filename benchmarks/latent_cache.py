"""Latents cached once vs encoded every batch: step time of a latent model, bytes per sample.

Builds a synthetic pixel dataset, encodes it once into a latent dataset (`drape data encode`'s
code, `drape.data.encode`), then trains the same stage of `latent-dit` for `--steps` steps twice
from the same seed, side by side in this one process: reading the cached latents, and reading
pixels and encoding the four images of each row with the frozen VAE every step (what a latent
model does without the cache). Prints the median step time of each and the ratio, the one-off
encode time and after how many steps it has paid for itself, and bytes per sample of the two
kinds of shard.

The VAE is shaped like SD3's (16 latent channels, 8× down) but narrower by default, so a CPU run
takes minutes; `--vae-channels 128,256,512,512 --vae-layers 2` is SD3's own shape. Its weights are
random and fixed (saved, as `model.vae.path` requires): encoding cost does not depend on them.
Synthetic images are flat colours and compress far better as PNG than photographs do, so the
pixel shards here are smaller than VITON-HD's would be at the same resolution.

    .venv/bin/python benchmarks/latent_cache.py                       # ~4 minutes on 2 CPU cores
    .venv/bin/python benchmarks/latent_cache.py --resolution 128 --steps 10
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

import torch  # noqa: E402

from drape import format_bytes  # noqa: E402
from drape.config import deep_merge, load_config, parse_config  # noqa: E402
from drape.data.dataset import build_dataset  # noqa: E402
from drape.data.encode import encode_dataset, source_config  # noqa: E402
from drape.data.partition import split_data  # noqa: E402
from drape.training.loop.trainer import train_stage  # noqa: E402

STAGE = "identity"


def _config(args, root: Path, vae: Path):
    raw = load_config(REPO / "configs" / "demo.yaml").model_dump(mode="json", by_alias=True)
    channels = [int(c) for c in args.vae_channels.split(",")]
    patch = {
        "paths": {"root": str(root / "drape")},
        "data": {
            "version": "v1-latents",
            "latents_of": "v1",
            "resolution": args.resolution,
            "synthetic": {"samples_per_stage": {"identity": args.samples, "texture": 8, "geometry": 8, "denoise": 8}},
            "control_samples": 8,
            "shard_max_samples": 32,
            "loader": {"workers": 1},
        },
        "model": {
            "kind": "latent-dit",
            "patch_size": 1,
            "garment_patch_size": 1,
            "num_layers": 2,
            "num_attention_heads": 4,
            "attention_head_dim": 32,
            "vae": {"path": str(vae), "latent_channels": 16, "block_out_channels": channels, "layers_per_block": args.vae_layers},
        },
        "train": {"batch_size": args.batch, "log_every": 1, "checkpoint_every": 10_000, "device": "cpu"},
    }
    return parse_config(deep_merge(raw, patch), "benchmarks/latent_cache.py")


def _save_vae(config, path: Path) -> None:
    from diffusers import AutoencoderKL

    from drape.training.recipes.latent import vae_config

    torch.manual_seed(0)
    shape = config.model.vae.model_copy(update={"path": None})  # the shape the config asks for; the path is where it goes
    AutoencoderKL.from_config(vae_config(shape, config.data.resolution)).save_pretrained(path, safe_serialization=True)


def _train(config, data, out: Path, steps: int) -> list[float]:
    seconds: list[float] = []

    def sink(metrics: dict, step: int) -> None:
        if f"{STAGE}/step_seconds" in metrics:  # the stage's end also reports per-rank data-wait
            seconds.append(metrics[f"{STAGE}/step_seconds"])

    cfg = parse_config(
        deep_merge(config.model_dump(mode="json", by_alias=True), {"train": {"stages": {STAGE: {"steps": steps}}}})
    )
    train_stage(cfg, stage=STAGE, data=data, out_dir=out, init_checkpoint=None, log_metrics=sink)
    return seconds[1:]  # the first step builds what later ones reuse


def _per_sample(manifest: dict) -> float:
    shards = manifest["splits"][STAGE]
    return sum(s["bytes"] for s in shards) / sum(s["samples"] for s in shards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--vae-channels", default="64,128,256,256", help="block_out_channels (SD3: 128,256,512,512)")
    parser.add_argument("--vae-layers", type=int, default=1, help="layers_per_block (SD3: 2)")
    parser.add_argument("--samples", type=int, default=64, help="samples of the stage encoded and trained on")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    with tempfile.TemporaryDirectory(prefix="drape-latent-bench-") as tmp:
        root = Path(tmp)
        probe = _config(args, root, root / "vae")
        _save_vae(probe, root / "vae")
        config = _config(args, root, root / "vae")
        print(f"pixel dataset at {args.resolution} px ...", flush=True)
        pixels = build_dataset(source_config(config), root / "pixels")
        print("encoding it once ...", flush=True)
        started = time.perf_counter()
        latents = encode_dataset(config, pixels, lambda shard: root / "pixels" / shard["path"], root / "latents")
        encode_seconds = time.perf_counter() - started
        encoded_samples = sum(s["samples"] for split, shards in latents["splits"].items() if split != "control" for s in shards)
        runs = {}
        for name, directory, manifest in (
            ("encode every batch", root / "pixels", pixels),
            ("cached latents", root / "latents", latents),
        ):
            print(f"{name}: {args.steps} steps ...", flush=True)
            runs[name] = statistics.median(
                _train(config, split_data(directory, manifest, STAGE), root / name.replace(" ", "-"), args.steps)
            )

    encoding, cached = runs["encode every batch"], runs["cached latents"]
    vae = config.model.vae
    shape = f"VAE {vae.block_out_channels} x {vae.layers_per_block}, 16 channels, {config.model.downsample}x down"
    print(f"\nlatent-dit at {args.resolution} px, batch {args.batch}; {shape}")
    print(f"{'':34}{'encode every batch':>20}{'cached latents':>20}{'ratio':>10}")
    print(f"{'step time (median)':34}{encoding * 1000:>17.1f} ms{cached * 1000:>17.1f} ms{encoding / cached:>9.2f}x")
    pixel_bytes, latent_bytes = _per_sample(pixels), _per_sample(latents)
    label = f"bytes per sample ({STAGE} shards)"
    print(f"{label:34}{format_bytes(pixel_bytes):>20}{format_bytes(latent_bytes):>20}{latent_bytes / pixel_bytes:>10.3f}")
    per_sample = encode_seconds / max(encoded_samples, 1)
    print(f"one-off encode: {encode_seconds:.1f} s for {encoded_samples} samples ({per_sample * 1000:.1f} ms/sample)")
    if encoding > cached:
        steps = encode_seconds / (encoding - cached)
        print(f"it pays for itself after {steps:.0f} steps of batch {args.batch}; every later epoch saves the whole encode")


if __name__ == "__main__":
    main()
