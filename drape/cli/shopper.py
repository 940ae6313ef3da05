"""`drape shopper`: per-shopper personalization, opt-in, gated, and erasable on request.

drape shopper photos --identity N --out DIR      a synthetic shopper's photos (demo, tests)
drape shopper personalize --shopper ID --photos DIR [--holdout DIR] [--base ALIAS]
drape shopper list                               enrolled shoppers, consent expiry, adapters
drape shopper forget ID                          erase everything of theirs, verify, audit
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from drape.cli.common import ConfigOption, Typer, console, fail, load, progress_bar

app = Typer(help="Per-shopper personalization: opt-in LoRA adapters, gated, erasable on request.", no_args_is_help=True)


@app.command("photos")
def photos(
    identity: int = typer.Option(..., min=0, help="the synthetic identity photographed"),
    out: Path = typer.Option(..., "--out", "-o", help="folder for the photo shards"),
    count: int = typer.Option(12, min=1, help="how many photos"),
    first: int = typer.Option(0, min=0, help="the first photo's index (disjoint sets: different --first)"),
    config: Path | None = ConfigOption,
) -> None:
    """Photos of one synthetic person (poses, garments and backgrounds vary), in the control format."""
    from drape.shoppers.photos import synthetic_photos

    keys = synthetic_photos(load(config), identity=identity, count=count, out=out, first=first)
    console.print(f"{len(keys)} photos of identity {identity} in {out}")


@app.command("personalize")
def personalize(
    shopper: str = typer.Option(..., "--shopper", "-s", help="the shopper's opaque id (never an email or a name)"),
    photos: Path = typer.Option(..., "--photos", "-p", help="folder of the shopper's photos (shards in the control format)"),
    holdout: Path | None = typer.Option(None, help="the shopper's held-out photos for the gate (default: the last of --photos)"),
    base: str | None = typer.Option(None, "--base", "-b", help="registry alias or checkpoint (default: inference.model)"),
    consent_days: int | None = typer.Option(None, min=1, help="how long their data is kept (default: shoppers.consent_days)"),
    config: Path | None = ConfigOption,
) -> None:
    """Train the shopper's adapter (a queue job of kind personalization when queue.enabled), gate it, keep or drop it."""
    from drape.inference.source import InferenceInputError
    from drape.layout import UnsafePathError
    from drape.shoppers import ShopperError
    from drape.shoppers.personalize import enroll
    from drape.shoppers.personalize import personalize as run_personalize

    cfg = load(config)
    try:
        enroll(cfg, shopper, photos, holdout=holdout, consent_days=consent_days)
        if cfg.queue.enabled:
            from scheduler.jobs.shoppers import run_personalization

            report = run_personalization(cfg, shopper=shopper, base=base, on_line=lambda line: console.print(line, markup=False))
        else:
            with progress_bar() as bar:
                task = bar.add_task("training the adapter", total=cfg.shoppers.steps)
                report = run_personalize(cfg, shopper, base=base, progress=lambda done, total: bar.update(task, completed=done))
    except (ShopperError, UnsafePathError, InferenceInputError) as error:
        fail(str(error))
    _print_report(report)
    if report["status"] != "kept":
        fail("the adapter failed the personalization gate and was not kept: " + "; ".join(report["gate"]["reasons"]), 1)


def _print_report(report: dict) -> None:
    identity, garments, job, cost = report["gate"]["identity"], report["gate"]["garments"], report["job"], report["cost"]
    console.print(
        f"shopper {report['shopper']}: adapter [bold]{report['status']}[/bold] "
        f"({report['adapter']['parameters']:,} parameters on {report['adapter']['layers']} layers, "
        f"{report['adapter']['bytes']:,} bytes)"
    )
    console.print(
        f"  identity on {identity['holdout_photos']} held-out photos: base {identity['base']:.4f}, adapter "
        f"{identity['adapter']:.4f} (gain {identity['gain']:+.4f}, needs {identity['min_gain']})"
    )
    for check, values in garments.items():
        console.print(
            f"  {check} on the control set: base {values['base']:.4f}, adapter {values['adapter']:.4f} "
            f"(drop {values['drop']:+.4f})"
        )
    console.print(
        f"  job {job['seconds']:.1f} s ({job['train_seconds']:.1f} s training) on {job['device']}, peak memory "
        f"{job['peak_memory_gib']:.2f} GiB; cost ${cost['compute_usd']:.4f} compute, {cost['stored_bytes']:,} bytes stored "
        f"(${cost['storage_usd_over_consent']:.6f} over {cost['consent_months']:.1f} months)"
    )
    if "price_note" in cost:
        console.print(f"  [yellow]compute not priced[/yellow]: {cost['price_note']}")


@app.command("list")
def list_shoppers(config: Path | None = ConfigOption) -> None:
    """Enrolled shoppers: consent expiry, adapter, try-on folders elsewhere."""
    from drape.layout import SHOPPERS, live_root
    from drape.shoppers.ledger import list_shoppers as ledgers

    for ledger in ledgers(live_root(load(config)) / SHOPPERS):
        state = "adapter kept" if ledger.adapter else "no adapter"
        expired = " [red](consent expired)[/red]" if ledger.expired else ""
        console.print(
            f"{ledger.shopper}: {state}; consent until {ledger.expires_at}{expired}; {len(ledger.outputs)} folders elsewhere"
        )


@app.command("forget")
def forget(
    shopper: str | None = typer.Argument(None, help="the shopper's id"),
    expired: bool = typer.Option(False, "--expired", help="every shopper whose consent has expired (shoppers.consent_days)"),
    config: Path | None = ConfigOption,
) -> None:
    """Erase every copy of the shopper's photos and all made from them; verify; write an audit record.
    Interrupted, run it again: it goes on from its journal."""
    from drape.layout import SHOPPERS, UnsafePathError, live_root
    from drape.shoppers import ShopperError
    from drape.shoppers.ledger import list_shoppers as ledgers

    cfg = load(config)
    if (shopper is None) == (not expired):
        fail("give a shopper id or --expired (not both)")
    chosen = [shopper] if shopper else [ledger.shopper for ledger in ledgers(live_root(cfg) / SHOPPERS) if ledger.expired]
    for one in chosen:
        try:
            audit = forget_shopper(cfg, one)
        except (ShopperError, UnsafePathError) as error:
            fail(str(error), 1)
        console.print(json.dumps(audit, indent=2), markup=False, highlight=False)
        console.print(f"[green]forgotten and verified[/green]: audit record {audit['request']}")
    if expired and not chosen:
        console.print("no shopper's consent has expired")


def forget_shopper(cfg, shopper: str) -> dict:
    """Every place drape keeps data (the object store, live storage and the shard cache, MLflow, the queue), then `forget`."""
    from drape.layout import LiveLayout, live_root, shard_cache_root
    from drape.shoppers.forget import Place
    from drape.shoppers.forget import forget as run_forget
    from drape.shoppers.places import LivePlace, MlflowPlace, ObjectStorePlace
    from drape.storage.store import open_store
    from scheduler.jobs.shoppers import QueuePlace

    layout, store = LiveLayout(live_root(cfg)), open_store(cfg)
    roots = [layout.root, shard_cache_root(cfg)]
    if "://" not in cfg.artifact_root or cfg.artifact_root.startswith("file://"):
        roots.append(Path(cfg.artifact_root.removeprefix("file://")))
    places: list[Place] = [
        ObjectStorePlace(store),
        LivePlace(layout.shopper(shopper).root, roots, [layout.root / "privacy"]),
        MlflowPlace(cfg.tracking_uri, cfg.shoppers.mlflow_backend_store_uri),
        QueuePlace(cfg),
    ]
    return run_forget(layout, store, shopper, places, log=lambda line: console.print(line, markup=False))
