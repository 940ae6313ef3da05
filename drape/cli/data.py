"""`drape data synth | shard | prestage`: datasets as stage shards, and the node's shard cache."""

from __future__ import annotations

from pathlib import Path

import typer

from drape import STAGES, format_bytes
from drape.cli.common import ConfigOption, Typer, console, fail, load, progress_bar
from drape.cli.render import table_of
from drape.layout import DATASET_MANIFEST, dataset_prefix

app = Typer(help="Datasets: synthesize, shard, pre-stage.", no_args_is_help=True)


@app.command("synth")
def data_synth(
    config: Path | None = ConfigOption,
    out: Path | None = typer.Option(None, help="write shards to this local directory instead of the object store"),
) -> None:
    """Generate the synthetic try-on dataset as stage shards plus the control set (whatever data.source says:
    generating it is what this command is for)."""
    from drape.data.dataset import build_dataset, dataset_prefix, ensure_dataset
    from drape.gates.recognizers import ControlSetError
    from drape.storage.store import open_store

    cfg = load(config)
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"source": "synthetic"})})
    sizes = {**cfg.data.synthetic.samples_per_stage, "control": cfg.data.control_samples}
    with progress_bar() as progress:
        bars = {split: progress.add_task(f"synth {split}", total=count) for split, count in sizes.items()}
        advance = lambda split, n: progress.advance(bars[split], n)  # noqa: E731
        try:
            if out is not None:
                manifest = build_dataset(cfg, out, advance)
                where = str(out)
            else:
                store = open_store(cfg)
                manifest = ensure_dataset(cfg, store, advance)
                where = f"{store!r} {dataset_prefix(cfg)}"
        except ControlSetError as error:  # a control set the gate could not judge: refused as it is made
            fail(f"input error: {error}")
    shards = sum(len(s) for s in manifest["splits"].values())
    console.print(
        f"dataset {manifest['name']}/{manifest['version']}: {shards} shards, control set {manifest['control_set']} → {where}"
    )


def _weights(text: str) -> dict[str, float]:
    weights = {}
    for item in filter(None, text.split(",")):
        stage, _, value = item.partition("=")
        if stage not in STAGES:
            raise typer.BadParameter(f"unknown stage {stage!r} in --weights; expected {'|'.join(STAGES)}")
        try:
            weights[stage] = float(value)
        except ValueError:
            raise typer.BadParameter(f"--weights {item!r}: expected <stage>=<number>") from None
    return weights


@app.command("shard")
def data_shard(
    source: str = typer.Argument(..., help="'synth', or the root of a VITON-HD or DressCode tree"),
    out: str = typer.Option(..., help="object store URL (s3://bucket/prefix, file:///path or a path)"),
    config: Path | None = ConfigOption,
    name: str | None = typer.Option(None, help="dataset name (default: data.name)"),
    version: str | None = typer.Option(None, help="dataset version (default: data.version)"),
    control: int | None = typer.Option(None, help="control-set samples held apart (default: data.control_samples)"),
    weights: str = typer.Option(
        "identity=1,texture=1,geometry=1,denoise=1", help="share of the other samples per stage, by hash of the pair key"
    ),
    shard_max_bytes: int | None = typer.Option(None, help="close a shard at this size (default: data.shard_max_bytes)"),
    shard_max_samples: int | None = typer.Option(None, help="close a shard at this many samples"),
    allow_paired_as_unpaired: bool = typer.Option(
        False,
        "--allow-paired-as-unpaired",
        help="import an unpaired test pairs file whose every line is a person with their own garment (refused by default)",
    ),
) -> None:
    """Cut SOURCE into datasets/<name>/<version>/<stage>/shard-NNNNN.tar + manifest.json at OUT."""
    import tempfile

    from drape.data.dataset import publish_dataset
    from drape.data.importers import SourceError
    from drape.storage.store import StorageError, open_store

    cfg = load(config)
    data = cfg.data.model_copy(
        update={
            "name": name or cfg.data.name,
            "version": version or cfg.data.version,
            "shard_max_bytes": shard_max_bytes or cfg.data.shard_max_bytes,
            "shard_max_samples": shard_max_samples or cfg.data.shard_max_samples,
            "control_samples": control or cfg.data.control_samples,
        }
    )
    store = open_store(cfg, out)
    prefix = dataset_prefix(data.name, data.version)
    if store.exists(f"{prefix}/{DATASET_MANIFEST}"):
        fail(f"{store.key_url(prefix)} already exists; dataset versions are immutable, pick a new --version")
    with tempfile.TemporaryDirectory(prefix="drape-shard-") as scratch, progress_bar() as progress:
        bar = progress.add_task(f"shard {source}", total=None)
        try:
            manifest = _cut(
                source,
                cfg.model_copy(update={"data": data}),
                scratch,
                _weights(weights),
                lambda split, n: progress.advance(bar, n),
                allow_paired_as_unpaired,
            )
            progress.update(bar, description=f"upload → {store!r}")
            publish_dataset(scratch, store, prefix)
        except (SourceError, ValueError, FileExistsError, StorageError) as error:
            fail(f"cannot shard {source}: {error}")
    _print_dataset(manifest, f"dataset {data.name}/{data.version} → {store.key_url(prefix)}")


def _cut(source: str, config, scratch: str, weights: dict[str, float], advance, allow_paired: bool = False) -> dict:
    """The dataset's shards and manifest in `scratch`: generated (`synth`) or imported from a VITON-HD or DressCode tree."""
    from drape.data.dataset import build_dataset, import_dataset

    if source == "synth":
        return build_dataset(config, scratch, advance)
    data = config.data
    return import_dataset(
        source,
        scratch,
        name=data.name,
        version=data.version,
        resolution=data.resolution,
        control=data.control_samples,
        weights=weights,
        max_samples=data.shard_max_samples,
        max_bytes=data.shard_max_bytes,
        progress=advance,
        allow_paired_as_unpaired=allow_paired,
        gates=config.gates,
    )


def _print_dataset(manifest: dict, title: str) -> None:
    table = table_of(title, ("split", "shards", "samples", "bytes"), left=("split",))
    for split, shards in manifest["splits"].items():
        samples, size = sum(s["samples"] for s in shards), sum(s["bytes"] for s in shards)
        table.add_row(split, str(len(shards)), str(samples), format_bytes(size))
    console.print(table)
    console.print(f"control set {manifest['control_set']}; stage rule {manifest['stage_rule'].get('rule')}")


@app.command("encode")
def data_encode(
    config: Path | None = ConfigOption,
    batch_size: int = typer.Option(16, min=1, help="samples per VAE forward"),
) -> None:
    """Encode version data.latents_of with model.vae into the latent version data.version, once."""
    from drape.data.dataset import dataset_prefix, ensure_dataset, read_manifest
    from drape.data.encode import LatentDatasetError, source_config
    from drape.storage.store import StorageError, open_store

    cfg = load(config)
    if cfg.data.latents_of is None:
        fail("data.latents_of is not set: name the pixel version to encode there, and the latent version in data.version")
    store = open_store(cfg)
    try:
        source = read_manifest(store, dataset_prefix(source_config(cfg))) or {}
        sizes = {split: sum(s["samples"] for s in shards) for split, shards in source.get("splits", {}).items()}
        with progress_bar() as progress:
            bars = {split: progress.add_task(f"encode {split}", total=sizes.get(split)) for split in STAGES}
            advance = lambda split, n: progress.advance(bars[split], n) if split in bars else None  # noqa: E731
            manifest = ensure_dataset(cfg, store, advance)  # data.latents_of is set: encodes
        source = read_manifest(store, dataset_prefix(source_config(cfg))) or {}
    except (LatentDatasetError, StorageError, ValueError) as error:
        fail(f"cannot encode {cfg.data.name}/{cfg.data.latents_of}: {error}")
    _print_dataset(manifest, f"latent dataset {cfg.data.name}/{cfg.data.version} (VAE {manifest['vae']['digest'][:12]})")
    table = table_of("bytes per sample", ("split", cfg.data.latents_of, cfg.data.version, "ratio"), left=("split",))
    for split in STAGES:
        pixels, latents = (_per_sample(m["splits"].get(split, [])) for m in (source, manifest))
        table.add_row(split, format_bytes(pixels), format_bytes(latents), f"{latents / pixels:.3f}" if pixels else "-")
    console.print(table)


def _per_sample(shards: list[dict]) -> float:
    samples = sum(s["samples"] for s in shards)
    return sum(s["bytes"] for s in shards) / samples if samples else 0.0


@app.command("prestage")
def data_prestage(
    stage: str = typer.Option(..., help="identity|texture|geometry|denoise|control"),
    config: Path | None = ConfigOption,
    keep: str = typer.Option("control", help="comma-separated splits eviction must not touch"),
) -> None:
    """Pre-stage a stage's shards from the object store into the node-local shard cache (verified)."""
    from drape.data.cache import CacheError
    from drape.pipeline import prestage_dataset
    from drape.storage.store import StorageError

    cfg = load(config)
    try:
        with progress_bar() as progress:
            bar = progress.add_task(f"prestage {stage}", total=None)
            result = prestage_dataset(
                cfg,
                stage,
                [s for s in keep.split(",") if s],
                progress=lambda done, total: progress.update(bar, completed=done, total=total),
            )
    except FileNotFoundError as error:
        fail(str(error))
    except (CacheError, StorageError) as error:
        fail(f"prestage failed: {error}", 1)
    console.print(
        f"{stage}: {result['shards']} shards, {format_bytes(result['bytes'])} in {result['directory']} "
        f"({result['downloaded']} downloaded, {format_bytes(result['downloaded_bytes'])}, {result['seconds']:.1f} s"
        + (f"; evicted {len(result['evicted'])}" if result["evicted"] else "")
        + ")"
    )
