"""`drape storage apply-lifecycle | report | sweep | restore`: the object store and what it holds."""

from __future__ import annotations

from pathlib import Path

import typer

from drape import format_bytes
from drape.cli.common import ConfigOption, Typer, console, fail, load, stage_argument
from drape.cli.render import lifecycle_table, print_storage_report

app = Typer(help="The object store: lifecycle rules, report, restore.", no_args_is_help=True)


@app.command("apply-lifecycle")
def storage_apply_lifecycle(config: Path | None = ConfigOption) -> None:
    """Write the bucket lifecycle rules generated from the retention policy (s3:// stores)."""
    from drape.storage.lifecycle import apply_lifecycle
    from drape.storage.store import StorageError, open_store

    cfg = load(config)
    store = open_store(cfg)
    try:
        rules = apply_lifecycle(store, cfg.retention, shopper_days=cfg.shoppers.consent_days)
    except StorageError as error:
        fail(str(error))
    console.print(lifecycle_table(f"lifecycle rules on {store!r} (read back from S3)", rules))


@app.command("report")
def storage_report_command(config: Path | None = ConfigOption) -> None:
    """Live bytes by kind, archived bytes by kind/outcome/class, modelled monthly cost, next expiries."""
    from drape.layout import live_root
    from drape.storage.report import storage_report
    from drape.storage.store import open_store

    cfg = load(config)
    print_storage_report(storage_report(cfg, open_store(cfg), live_root(cfg)))


@app.command("sweep")
def storage_sweep(
    config: Path | None = ConfigOption,
    dry_run: bool = typer.Option(False, help="say what would change, change nothing"),
    allow_unregistered: bool = typer.Option(
        False, help="supersede archived baselines of stages the registry has no baseline for (else: an error)"
    ),
) -> None:
    """Retag superseded baselines, delete expired objects where lifecycle rules cannot (file://) and
    the hand-off copies of superseded baselines."""
    from drape import pipeline

    cfg = load(config)
    result = pipeline.sweep(cfg, dry_run=dry_run, allow_unregistered=allow_unregistered)
    verb = "would retag" if dry_run else "retagged"
    console.print(
        f"{verb} {len(result['retagged'])} superseded baseline object(s); "
        f"{'would delete' if dry_run else 'deleted'} {len(result['deleted'])} expired object(s) and "
        f"{len(result['handoffs'])} superseded baseline hand-off(s) ({format_bytes(result['freed_bytes'])})"
    )


@app.command("restore")
def storage_restore(
    run_id: str = typer.Argument(..., help="run id (as in the archive manifest)"),
    stage: str = typer.Argument(..., help="identity|texture|geometry|denoise", callback=stage_argument),
    config: Path | None = ConfigOption,
    out: Path | None = typer.Option(None, help="destination (default <root>/live/restored/RUN/STAGE)"),
) -> None:
    """Bring a stage's archived snapshot back to live storage, verified, for resume or audit."""
    from drape.layout import LiveLayout, live_root
    from drape.storage.restore import restore_stage
    from drape.storage.store import StorageError, open_store

    cfg = load(config)
    destination = out or LiveLayout(live_root(cfg)).restored(run_id, stage)
    try:
        files = restore_stage(open_store(cfg), run_id, stage, destination, bases=LiveLayout(live_root(cfg)).bases)
    except (FileNotFoundError, StorageError) as error:
        fail(str(error))
    console.print(f"restored {len(files)} files ({format_bytes(sum(f.stat().st_size for f in files))}) to {destination}")
