"""`drape model describe | export | fit-vae`: which model a config trains and which weight files it reads,
a stage's result written in the layouts the field loads, and a stand-in VAE for latent smoke runs."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import typer
from rich.markup import escape

from drape import STAGES, JobKind
from drape.cli.common import ConfigOption, Typer, console, fail, load, progress_bar
from drape.cli.render import table_of

app = Typer(help="The try-on model: describe it, export it, fit a stand-in VAE.", no_args_is_help=True)


def _millions(count: int) -> str:
    return f"{count / 1e6:,.2f} M" if count >= 1e4 else f"{count:,}"


def _modules(names: list[str], depth: int = 2) -> str:
    """Trained parameter names grouped by their first `depth` components: 'transformer.transformer_blocks (24)'."""
    groups: dict[str, int] = defaultdict(int)
    for name in names:
        parts = name.split(".")
        groups[".".join(p for p in parts[:depth] if not p.isdigit())] += 1
    return ", ".join(f"{group} ({count})" for group, count in sorted(groups.items()))


def _top_modules(sizes: dict[str, int], frozen: tuple[str, ...]) -> str:
    """Parameters per top-level module, frozen ones marked: 'unet 815.57 M, vae 83.65 M (frozen)'."""
    groups: dict[str, int] = defaultdict(int)
    for name, count in sizes.items():
        groups[name.split(".")[0]] += count
    marked = {group: " (frozen)" if f"{group}.".startswith(frozen) else "" for group in groups}
    return ", ".join(f"{group} {_millions(count)}{marked[group]}" for group, count in groups.items())


@app.command("describe")
def model_describe(config: Path | None = ConfigOption) -> None:
    """The model a config builds: its class, parameters in total and per stage, the queue's memory
    estimate per stage job, and what each stage trains."""
    from drape.training.recipes.model import configured_class_path, trainable_parameter_names
    from drape.training.recipes.sources import weight_lines
    from scheduler.jobs.profiles import estimate, lora_parameters, model_facts

    cfg = load(config)
    try:
        facts = model_facts(cfg)  # the queue's own view of the model: what its estimates read
        weights = weight_lines(cfg)  # which files that view read, or why it shows a built-in shape
    except ValueError as error:
        fail(f"model: {error}")
    sizes = dict(facts.sizes)
    frozen, shape, total = facts.frozen, facts.workload, sum(sizes.values())
    trainable = {
        n
        for stage in STAGES
        for n in trainable_parameter_names(cfg.train.stages[stage].trainable, list(sizes), facts.frozen_prefixes)
    }
    console.print(
        f"[bold]{cfg.name}[/bold]: {cfg.model.class_ or cfg.model.kind} ({configured_class_path(cfg)}) at "
        f"{cfg.data.resolution_label}, {_millions(total)} parameters ({_millions(frozen)} frozen), "
        f"{_millions(sum(sizes[n] for n in trainable))} trainable by the stages, "
        f"{shape.tokens} tokens × {shape.hidden} wide × {shape.layers} layers per sample"
    )
    console.print(f"counted: every tensor the model holds: {_top_modules(sizes, facts.frozen_prefixes)}")
    for line in weights:
        console.print(f"weights: {escape(line)}" if "could not read" not in line else f"[yellow]weights: {escape(line)}[/yellow]")
    lora = cfg.train.lora
    finetune = f"fine-tune (LoRA r{lora.rank})" if lora.enabled else "fine-tune (full)"
    table = table_of(
        f"stages (batch {cfg.train.batch_size}, {cfg.train.precision})",
        ("stage", "trains", "share", "steps", "GPUs", "est. GiB/GPU", "est. time", finetune, "modules trained"),
        left=("stage", "modules trained"),
    )
    for stage in STAGES:
        names = trainable_parameter_names(cfg.train.stages[stage].trainable, list(sizes), facts.frozen_prefixes)
        trained, gpus = sum(sizes[n] for n in names), cfg.train.gpus_for(stage)
        gib, seconds = estimate(cfg, JobKind.STAGE_TRAINING, stage, gpus, counts=(total, trained))
        tuned_gib, _ = estimate(cfg, JobKind.FINETUNE, stage, gpus, counts=(total, trained))
        tuned = lora_parameters(cfg, stage) if lora.enabled else trained
        table.add_row(
            stage,
            _millions(trained),
            f"{100 * trained / total:.1f}%",
            str(cfg.train.stages[stage].steps),
            str(gpus),
            f"{gib:.1f}",
            f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min",
            f"{_millions(tuned)}, {tuned_gib:.1f} GiB/GPU",
            _modules(names) or "[red]nothing: the patterns match no trainable parameter[/red]",
        )
    console.print(table)
    console.print("estimates: H100 bf16 at 35% MFU (scheduler/jobs/profiles.py); measured peaks replace them once jobs ran")


@app.command("export")
def model_export(
    checkpoint: Path = typer.Option(..., help="a drape checkpoint of model.kind catvton (a stage's result)"),
    format: str = typer.Option(..., "--format", help="catvton: CatVTON's release layout; diffusers: unet/ and vae/ folders"),
    out: Path = typer.Option(..., help="the folder to write (replaced once the new one is verified)"),
) -> None:
    """Write a stage's result in a layout the field loads, read it back and compare it bit for bit
    before it replaces OUT: CatVTON's attention/model.safetensors, or diffusers save_pretrained folders."""
    from drape.training.checkpoints.checkpoint import CheckpointError, load_model
    from drape.training.checkpoints.export import export_model

    try:
        verified = export_model(load_model(checkpoint), out, format)
    except (CheckpointError, ValueError, OSError) as error:
        fail(f"drape model export: {error}")
    how = (
        "model.denoiser: {path: OUT, base: <its base unet/>} or drape train --init OUT"
        if format == "catvton"
        else "model.denoiser.path: OUT, model.vae.path: OUT/vae"
    )
    console.print(f"{out}: {format} layout, {verified} tensors read back bit for bit; drape reads it with {how}")


@app.command("fit-vae")
def model_fit_vae(
    out: Path = typer.Option(..., help="directory to write the AutoencoderKL to (config.json + safetensors)"),
    config: Path | None = ConfigOption,
    steps: int = typer.Option(300, min=1, help="optimizer steps"),
    samples: int = typer.Option(64, min=1, help="synthetic samples whose images it fits"),
) -> None:
    """Fit a small AutoencoderKL shaped by the config's model.vae on synthetic images: a stand-in
    for smoke runs and tests where no pretrained VAE is at hand (set model.vae.path to OUT)."""
    import shutil

    from drape.training.recipes.latent import fit_vae, reconstruction_error, synthetic_images, vae_config

    cfg = load(config)
    if cfg.model.vae.path is not None:
        fail(f"model.vae.path is set ({cfg.model.vae.path}): fit-vae shapes a fresh VAE from model.vae's other fields")
    images = synthetic_images(cfg, samples)
    with progress_bar() as bar:
        task = bar.add_task("fitting the VAE", total=steps)
        vae = fit_vae(
            images,
            vae_config(cfg.model.vae, cfg.data.resolution),
            steps,
            progress=lambda done, _: bar.update(task, completed=done),
        )
    temporary = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    vae.save_pretrained(temporary, safe_serialization=True)
    shutil.rmtree(out, ignore_errors=True)
    temporary.rename(out)
    error = reconstruction_error(vae, next(images))
    console.print(
        f"{out}: AutoencoderKL, {vae.config.latent_channels} latent channels, scaling {vae.config.scaling_factor:.3f}, "
        f"shift {vae.config.shift_factor:.3f}; reconstruction error {error:.3f} (mean |Δ| in [-1, 1])"
    )
