"""How far apart the gate puts trained checkpoints and broken ones, on the control set.

Side by side, same control set, same sampler seed: each stage baseline of the last run, then the
last baseline with scrambled weights, a freshly initialised model, the agnostic input copied
through, and the right images of the wrong person and garment (targets rolled by one sample).
Prints each check's thresholded value, the bootstrap lower bound of its mean (the mean in
brackets), the thresholds, and per check the ratio of the worst trained
value to the best broken value among the breakages aimed at that check (a copied agnostic
input keeps the face intact, so it is not counted against the identity check). Run after `make demo`
(it reads .drape/live/baselines):

    .venv/bin/python benchmarks/gate_separation.py [--config configs/demo.yaml]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from drape import STAGES
from drape.config import default_config_path, load_config
from drape.data.cache import ShardCache
from drape.data.dataset import dataset_prefix, load_split, to_model_inputs
from drape.gates.run import judge, to_uint8
from drape.gates.verdict.report import CHECKS
from drape.pipeline import live_root
from drape.storage.store import open_store
from drape.training.checkpoints.checkpoint import load_model
from drape.training.recipes.model import build_model, sample


def scrambled(model: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            flat = parameter.flatten()
            parameter.copy_(flat[torch.randperm(flat.numel(), generator=generator)].view_as(parameter))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(default_config_path()))
    config = load_config(parser.parse_args().config)
    live = live_root(config)
    store = open_store(config)
    manifest = json.loads(store.read_bytes(f"{dataset_prefix(config)}/manifest.json"))
    cache = ShardCache.from_config(config, store, dataset_prefix(config), manifest)
    cache.prestage("control")  # local after a run; fetched (and verified) if the cache was cleared
    control = load_split(cache.dataset_dir, manifest, "control")
    inputs = to_model_inputs(control)
    generate = lambda model: to_uint8(sample(model.eval(), config.diffusion, inputs, seed=config.gates.sample_seed))  # noqa: E731

    # (name, stage judged, outputs, checks the outputs must fail: empty for trained ones)
    rows: list[tuple[str, str, np.ndarray, set[str]]] = []
    for stage in STAGES:
        model = load_model(live / "baselines" / stage / "checkpoint", prefer_ema=True)
        rows.append((f"trained: {stage} baseline", stage, generate(model), set()))
    last = live / "baselines" / STAGES[-1] / "checkpoint"
    rows += [
        ("broken: scrambled weights", STAGES[-1], generate(scrambled(load_model(last))), set(CHECKS)),
        ("broken: fresh initialisation", STAGES[-1], generate(build_model(config)), set(CHECKS)),
        ("broken: agnostic input copied (face intact)", STAGES[-1], control["agnostic"], {"texture", "coherence"}),
        ("broken: wrong person and garment", STAGES[-1], np.roll(control["target"], 1, axis=0), set(CHECKS)),
    ]

    table = Table(
        title=f"gate separation on control set {manifest['control_set']} ({len(control['keys'])} samples): lower bound (mean)"
    )
    table.add_column("outputs")
    for check in CHECKS:
        table.add_column(check, justify="right")
    means: dict[str, dict[str, float]] = {}  # the thresholded value: the lower bound
    for name, stage, outputs, _ in rows:
        report = judge(
            config,
            stage=stage,
            run_id="benchmark",
            checkpoint=name,
            control=control,
            control_set=manifest["control_set"],
            outputs=outputs,
            baseline_outputs=None,
            baseline=None,
        )
        means[name] = {check: report.checks[check].lower for check in CHECKS}
        table.add_row(name, *(f"{report.checks[c].lower:.3f} ({report.checks[c].mean:.3f})" for c in CHECKS))
    thresholds = [config.gates.thresholds(stage) for stage in STAGES]
    table.add_row(
        "threshold (per stage)",
        *(" / ".join(str(t[check]) if isinstance(t[check], str) else f"{t[check]:.2f}" for t in thresholds) for check in CHECKS),
    )
    ratios = []
    for check in CHECKS:
        worst_trained = min(means[name][check] for name, _, _, aims in rows if not aims)
        best_broken = max(means[name][check] for name, _, _, aims in rows if check in aims)
        ratios.append(f"{worst_trained / max(best_broken, 1e-6):.2f}x")
    table.add_row("ratio: worst trained / best broken aimed at it", *ratios)
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
