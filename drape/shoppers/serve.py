"""`drape tryon --shopper ID`: the promoted model with the shopper's kept adapter merged in.

Outputs go to ``live/shoppers/<id>/tryons/<time>/`` unless `--out` says otherwise; a folder
elsewhere is written into the shopper's ledger before the first image, so a forget erases it too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from drape.config import PipelineConfig
from drape.inference.tryon import RECOMMENDED, render_tryons
from drape.shoppers import ShopperError
from drape.shoppers.ledger import require_ledger, write_ledger
from drape.shoppers.personalize import shopper_paths


def shopper_tryons(
    config: PipelineConfig,
    shopper: str,
    *,
    out: Path | None = None,
    inputs: str | None = None,
    variant: str = RECOMMENDED,
    seed: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[dict, Path]:
    """Render `inputs` with base + the shopper's adapter; returns (tryon.json's summary, the folder)."""
    paths = shopper_paths(config, shopper)
    ledger = require_ledger(paths)
    if ledger.adapter is None or not paths.adapter.is_dir():
        raise ShopperError(f"shopper {shopper!r}: no adapter passed the personalization gate; see {paths.report}")
    base = ledger.adapter["base"]
    out = (out or paths.tryons(datetime.now(UTC).strftime("%Y%m%dT%H%M%S"))).resolve()
    if not out.is_relative_to(paths.root.resolve()):
        ledger.remember("outputs", str(out))
        write_ledger(paths, ledger)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tryon.json").write_text(json.dumps({"shopper": shopper, "outputs": [], "rendering": True}))
    summary = render_tryons(
        config,
        out=out,
        model=base["alias"] or base["model"],
        inputs=inputs,
        variant=variant,
        seed=seed,
        progress=progress,
        adapter=paths.adapter,
        shopper=shopper,
    )
    return summary, out
