"""Stage checkpoints (plain and byte-plane packed) vs whole-model checkpoints on the full-size CatVTON recipe.

Builds CatVTON at configs/h100.yaml's shapes (SD1.5-inpainting's UNet without cross-attention +
SD1.5's VAE: 899.23 M parameters, fp32) with random weights (`pretrained=False`: nothing is read or
downloaded) and trains the 49.57 M self-attention parameters every stage trains (`unet.*.attn1.*`)
for `--steps` real AdamW steps (lr 1e-5, CatVTON's; forward and backward of the whole UNet on
random 8x8 latents, MSE to a random target; EMA decay 0.9999 after each), so weights, AdamW moments
and EMA hold the values a stage's checkpoint holds early in training (random-init weights, moments
of real gradients): the values byte-plane packing compresses. Then, in one run, for three formats
(`drape.training.checkpoints.checkpoint.save_checkpoint`: without `bases`; with `bases`; with `bases`
and `compress`, `train.checkpoint_compression: planes`):

- stage checkpoint bytes (model weights + optimizer + EMA + manifest), and the base; the same
  without EMA (a recipe with `train.ema.enabled: false`) and with bf16 AdamW moments
  (`train.checkpoint_moments: bfloat16`, lossy), and the byte arithmetic of the 6x goal;
- archived bytes of a four-stage run with one checkpoint per stage: four whole checkpoints today
  (the archive copies files byte for byte: 4 x their bytes); four stage checkpoints archived through
  `drape.storage.retention.execute_plan` into a file:// store, once by the first run over the base
  (it sends the base) and once by a run whose base the store already holds (it refers to it);
- per packed file (stage, optimizer, EMA): raw and packed bytes, pack time (zstd + read back and
  verified) and read time, packed (unpack + sha256) vs plain (safetensors), medians of `--runs`;
- save time (median of `--runs`; the stage format's first save of a run also writes the base, shown
  on its own row, and hashes it: the content hash's time is its own row) and load time
  (`load_model`: every file's sha256 checked; the stage format also re-hashes the base as it reads it).

Every loaded model is checked bit for bit against the saved one (a content hash of its whole state).
One model copy is alive at a time (3.6 GB): it fits a 24 GiB machine.

    PYTHONPATH=. .venv/bin/python benchmarks/checkpoint_size.py --runs 3     # ~25 min on 2 shared cores
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from drape.config import RetentionConfig, load_config  # noqa: E402
from drape.storage.retention import classify_stage_dir, execute_plan, plan_retention  # noqa: E402
from drape.storage.store import ObjectStore, tree_bytes  # noqa: E402
from drape.training.checkpoints.base import content_hash  # noqa: E402
from drape.training.checkpoints.checkpoint import load_model, save_checkpoint  # noqa: E402
from drape.training.checkpoints.planes import SUFFIX, load_packed, pack_file  # noqa: E402
from drape.training.checkpoints.stored import PACKABLE  # noqa: E402
from drape.training.recipes.model import build_model, trainable_parameter_names  # noqa: E402

GB = 1e9


def build(scratch: Path, steps: int):
    """The full-size model with random weights, its trainable names, an AdamW after `steps` real
    steps over them, and their EMA (decay 0.9999)."""
    config = load_config(
        REPO / "configs" / "h100.yaml", {"paths": {"root": str(scratch)}}, site=REPO / "configs" / "site.example.yaml"
    )
    model = build_model(config, pretrained=False)
    names = trainable_parameter_names(
        config.train.stages["identity"].trainable, [n for n, _ in model.named_parameters()], model.frozen_prefixes
    )
    parameters = dict(model.named_parameters())
    for name, parameter in parameters.items():
        parameter.requires_grad_(name in set(names))
    trained = [parameters[n] for n in names]
    optimizer = torch.optim.AdamW(trained, lr=1e-5)
    ema = {n: parameters[n].detach().clone() for n in names}
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        latent = functools.partial(torch.randn, (1, 4, 8, 8), generator=generator)
        mask = torch.rand((1, 1, 8, 8), generator=generator)
        prediction = model(latent(), torch.tensor([500]), agnostic=latent(), mask=mask, garment=latent())
        torch.nn.functional.mse_loss(prediction, latent()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name in names:
                ema[name].lerp_(parameters[name], 1e-4)
    return model, names, optimizer, ema


def timed(function) -> tuple[float, object]:
    started = time.perf_counter()
    value = function()
    return time.perf_counter() - started, value


def save(model, names, optimizer, ema, path: Path, bases: Path | None, moments=None, compress=False) -> float:
    manifest = {"stage": "identity", "step": 1}
    seconds, _ = timed(
        lambda: save_checkpoint(
            path,
            model=model,
            optimizer=optimizer,
            trainable_names=names,
            ema=ema,
            manifest=manifest,
            bases=bases,
            moments=moments,
            compress=compress,
        )
    )
    return seconds


def load(path: Path, expected: str) -> float:
    seconds, model = timed(lambda: load_model(path))
    assert content_hash(model.state_dict()) == expected, f"{path}: the loaded model is not the saved one"
    del model
    gc.collect()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="saves and loads per format (medians)")
    parser.add_argument("--steps", type=int, default=3, help="real AdamW steps before the saves (about 40 s each here)")
    parser.add_argument("--scratch", type=Path, default=None, help="where checkpoints are written (default: a temporary folder)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="drape-ckpt-size-", dir=args.scratch))
    try:
        return measure(scratch, args.runs, args.steps)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def measure(scratch: Path, runs: int, steps: int) -> int:
    seconds, (model, names, optimizer, ema) = timed(lambda: build(scratch, steps))
    state = model.state_dict()
    total = sum(t.numel() for t in state.values())
    trained = sum(state[n].numel() for n in names)
    print(f"model: CatVTON at configs/h100.yaml's shapes, {total / 1e6:.2f} M values in {len(state)} tensors, "
          f"{trained / 1e6:.2f} M trained ({len(names)} tensors); built with random weights and trained {steps} "
          f"steps in {seconds:.0f} s")  # fmt: skip
    frozen = {n: t for n, t in state.items() if n not in set(names)}
    hash_times = [timed(functools.partial(content_hash, frozen))[0] for _ in range(runs)]
    expected = content_hash(state)
    del frozen, state
    whole_saves = [save(model, names, optimizer, ema, scratch / "whole" / f"step-{i}", None) for i in range(runs)]
    bases = scratch / "live" / "bases"
    first_save = save(model, names, optimizer, ema, scratch / "live" / "run" / "step-first", bases)
    model.__dict__.pop("_drape_base_hash", None)  # a fresh process: the hash is computed again, the base is there
    again_save = save(model, names, optimizer, ema, scratch / "live" / "run" / "step-again", bases)
    stage_saves = [save(model, names, optimizer, ema, scratch / "live" / "run" / f"step-{i}", bases) for i in range(runs)]
    packed_saves = [save(model, names, optimizer, ema, scratch / "live" / "run" / f"packed-{i}", bases, compress=True)
                    for i in range(runs)]  # fmt: skip
    save(model, names, optimizer, None, scratch / "live" / "run" / "step-no-ema", bases)
    save(model, names, optimizer, ema, scratch / "live" / "run" / "step-bf16-moments", bases, torch.bfloat16)
    trained_bytes = sum(t.numel() * t.element_size() for n, t in model.state_dict().items() if n in set(names))
    del model, optimizer, ema
    gc.collect()
    whole_loads = [load(scratch / "whole" / f"step-{i}", expected) for i in range(runs)]
    stage_loads = [load(scratch / "live" / "run" / f"step-{i}", expected) for i in range(runs)]
    packed_loads = [load(scratch / "live" / "run" / f"packed-{i}", expected) for i in range(runs)]
    files = measure_files(scratch / "live" / "run" / "step-0", scratch / "packing", runs)
    packed_bytes = tree_bytes(scratch / "live" / "run" / "packed-0")
    whole_bytes = tree_bytes(scratch / "whole" / "step-0")
    stage_bytes, base_bytes = tree_bytes(scratch / "live" / "run" / "step-0"), tree_bytes(bases)
    no_ema_bytes = tree_bytes(scratch / "live" / "run" / "step-no-ema")
    bf16_bytes = tree_bytes(scratch / "live" / "run" / "step-bf16-moments")
    store = ObjectStore(f"file://{scratch / 'objects'}")
    archived = [archive_run(scratch, store, run_id, "step-0") for run_id in ("run-first", "run-registered")]
    packed_store = ObjectStore(f"file://{scratch / 'objects-packed'}")
    archived += [archive_run(scratch, packed_store, run_id, "packed-0") for run_id in ("run-first", "run-registered")]
    saves, loads = (whole_saves, stage_saves, packed_saves), (whole_loads, stage_loads, packed_loads)
    print_table(runs, whole_bytes, stage_bytes, packed_bytes, base_bytes, saves, first_save, again_save, hash_times,
                loads, archived, no_ema_bytes, bf16_bytes)  # fmt: skip
    print_files(files, runs)
    print_arithmetic(whole_bytes, trained_bytes, stage_bytes, packed_bytes, no_ema_bytes, bf16_bytes)
    budget = 4 * whole_bytes / 4
    print(f"4x goal on the first run over a base: at most {budget / GB:.3f} GB archived; the base alone is "
          f"{base_bytes / GB:.3f} GB ({100 * base_bytes / budget:.0f}% of it) and four stage checkpoints "
          f"{4 * stage_bytes / GB:.3f} GB more: {(base_bytes + 4 * stage_bytes) / GB:.3f} GB. A run on a registered base "
          f"archives the four stage checkpoints only ({archived[1] / GB:.3f} GB measured; packed "
          f"{archived[3] / GB:.3f} GB).")  # fmt: skip
    return 0


def archive_run(scratch: Path, store: ObjectStore, run_id: str, source: str) -> int:
    """Bytes a four-stage run archives: `source` as each stage's promoted checkpoint (hard links:
    nothing copied), archived with drape's archive step (upload, read back, verify, then free)."""
    archived = 0
    for stage in ("identity", "texture", "geometry", "denoise"):
        stage_dir = scratch / "live" / "runs" / run_id / stage
        shutil.copytree(scratch / "live" / "run" / source, stage_dir / "checkpoints" / "step-0000001", copy_function=os.link)
        key_root = f"runs/{run_id}/{stage}"
        actions = plan_retention(classify_stage_dir(stage_dir, "passed"), RetentionConfig(), key_root=key_root)
        manifests = f"archive/manifests/{run_id}/{stage}"
        archived += execute_plan(actions, store, manifests, run_id=run_id, stage=stage).archived_bytes
    return archived


def measure_files(checkpoint: Path, scratch: Path, runs: int) -> dict[str, dict]:
    """Per packable file of the plain stage checkpoint: raw and packed bytes, pack time (zstd, written,
    read back and verified), read time packed (unpacked, sha256 checked) and plain (safetensors)."""
    from safetensors.torch import load_file

    scratch.mkdir(parents=True, exist_ok=True)
    found = {}
    for name in PACKABLE:
        raw, packed = checkpoint / name, scratch / f"{name}{SUFFIX}"
        packs = [timed(functools.partial(pack_file, raw, packed)) for _ in range(runs)]
        record = packs[-1][1]
        unpacks = [timed(functools.partial(load_packed, packed, record))[0] for _ in range(runs)]
        reads = [timed(functools.partial(load_file, str(raw)))[0] for _ in range(runs)]
        found[name] = {"raw": raw.stat().st_size, "packed": packed.stat().st_size, "pack": [t for t, _ in packs],
                       "unpack": unpacks, "read": reads}  # fmt: skip
    return found


def print_files(files: dict[str, dict], runs: int) -> None:
    median = statistics.median
    print(f"\nper file, byte planes + zstd level 1 (medians of {runs}; pack = compress + write + read back + verify)")
    print(f"{'file':<22}  {'raw MB':>8}  {'packed MB':>9}  {'packed/raw':>10}  {'pack s':>7}  {'pack MB/s':>9}  "
          f"{'unpack s':>8}  {'plain read s':>12}")  # fmt: skip
    for name, f in files.items():
        pack = median(f["pack"])
        print(f"{name:<22}  {f['raw'] / 1e6:>8.1f}  {f['packed'] / 1e6:>9.1f}  {f['packed'] / f['raw']:>10.3f}  {pack:>7.2f}  "
              f"{f['raw'] / 1e6 / pack:>9.0f}  {median(f['unpack']):>8.2f}  {median(f['read']):>12.2f}")  # fmt: skip
    raw, packed = sum(f["raw"] for f in files.values()), sum(f["packed"] for f in files.values())
    print(f"{'all three':<22}  {raw / 1e6:>8.1f}  {packed / 1e6:>9.1f}  {packed / raw:>10.3f}")


def print_arithmetic(whole_bytes: int, trained_bytes: int, stage_bytes: int, packed_bytes: int, no_ema_bytes: int,
                     bf16_bytes: int) -> None:  # fmt: skip
    """The 6x goal in bytes: four copies of the trained tensors, and what packing makes of them."""
    goal, copies = whole_bytes / 6, stage_bytes / trained_bytes
    print(f"\n6x goal: a stage checkpoint of at most {whole_bytes / GB:.3f} / 6 = {goal / GB:.3f} GB. The trained tensors "
          f"are {trained_bytes / GB:.4f} GB in fp32; a checkpoint that resumes bit for bit holds them, AdamW's two "
          f"moments of the same size and, with EMA on, their EMA: 4 x {trained_bytes / GB:.4f} = {4 * trained_bytes / GB:.3f} GB "
          f"(measured {stage_bytes / GB:.3f} GB, {copies:.3f} copies: manifest and config are the rest), "
          f"{whole_bytes / stage_bytes:.2f}x. Packed in byte planes (lossless): {packed_bytes / GB:.3f} GB, "
          f"{whole_bytes / packed_bytes:.2f}x ({packed_bytes / trained_bytes:.3f} copies; 6x needs at most "
          f"{goal / trained_bytes:.2f}): the goal is {'met' if packed_bytes <= goal else 'missed'}.")  # fmt: skip
    print(
        f"- EMA off (train.ema.enabled: false, measured, plain): 3 copies, {no_ema_bytes / GB:.3f} GB, "
        f"{whole_bytes / no_ema_bytes:.2f}x; lossless, but no averaged weights to gate or serve."
    )
    print(
        f"- bf16 AdamW moments, EMA on (train.checkpoint_moments: bfloat16, measured, plain): {bf16_bytes / GB:.3f} GB, "
        f"{whole_bytes / bf16_bytes:.2f}x; lossy: each moment rounded to 8 significant bits (relative error up to "
        "2^-9), so a resumed stage no longer matches an uninterrupted one bit for bit."
    )


def timing(label: str, times: tuple[list[float], ...]) -> tuple:
    whole, *others = (statistics.median(t) for t in times)
    return label, f"{whole:.2f}", *(f"{t:.2f}" for t in others), whole / others[-1]


def print_table(runs, whole_bytes, stage_bytes, packed_bytes, base_bytes, saves, first_save, again_save, hash_times,
                loads, archived, no_ema_bytes, bf16_bytes) -> None:  # fmt: skip
    median = statistics.median
    first, registered, packed_first, packed_registered = archived
    gb = lambda value: f"{value / GB:.3f} GB"  # noqa: E731
    rows = [
        ("stage checkpoint bytes", gb(whole_bytes), gb(stage_bytes), gb(packed_bytes), whole_bytes / packed_bytes),
        ("stage checkpoint bytes, EMA off", "-", gb(no_ema_bytes), "-", None),
        ("stage checkpoint bytes, bf16 moments (lossy)", "-", gb(bf16_bytes), "-", None),
        ("frozen base (once, shared)", "-", gb(base_bytes), gb(base_bytes), None),
        ("archived bytes, 4-stage run, first over its base", gb(4 * whole_bytes), gb(first), gb(packed_first),
         4 * whole_bytes / packed_first),
        ("archived bytes, 4-stage run on a registered base", gb(4 * whole_bytes), gb(registered), gb(packed_registered),
         4 * whole_bytes / packed_registered),
        timing(f"save, median of {runs} (s)", saves),
        ("save, first of a run: writes the base (s)", "-", f"{first_save:.2f}", "-", None),
        ("save, new process, base there: hashes it (s)", "-", f"{again_save:.2f}", "-", None),
        (f"content hash of the base, median of {runs} (s)", "-", f"{median(hash_times):.2f}", "-", None),
        timing(f"load + verify, median of {runs} (s)", loads),
    ]  # fmt: skip
    width = max(len(row[0]) for row in rows)
    print(f"\n{'':<{width}}  {'whole (today)':>14}  {'stage + base':>14}  {'stage, planes':>14}  {'ratio':>7}")
    for label, old, plain, packed, ratio in rows:
        print(f"{label:<{width}}  {old:>14}  {plain:>14}  {packed:>14}  {f'{ratio:.2f}x' if ratio else '':>7}")
    print("(ratio: whole (today) / stage, planes)")
    for label, (whole, stage, packed) in (("saves", saves), ("loads", loads)):
        print(f"{label} (s): whole {[round(t, 2) for t in whole]}, stage {[round(t, 2) for t in stage]}, "
              f"packed {[round(t, 2) for t in packed]}")  # fmt: skip
    print(f"content hash (s): {[round(s, 2) for s in hash_times]}")
    print("every load matched the saved model bit for bit (content hash of the whole state)")


if __name__ == "__main__":
    raise SystemExit(main())
