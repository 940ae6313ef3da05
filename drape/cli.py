"""The `drape` command: the composition root (it alone in drape/ may reach the flows).

    drape demo                      the whole pipeline on the embedded demo config
    drape run --config FILE         the staged-training flow on any config
    drape data synth                generate the synthetic dataset as stage shards
    drape data shard SOURCE --out URL   cut synth / VITON-HD / DressCode into stage shards
    drape data prestage --stage S   pre-stage a stage's shards into the node-local cache
    drape train --config FILE --stage S   one stage, no orchestrator
    drape gate check | calibrate    judge outputs from anywhere; measure the checks themselves
    drape queue submit|list|cancel|dispatch|profile|simulate   the memory-profile-aware GPU queue
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from drape.config import ConfigError, default_config_path, load_config

app = typer.Typer(help="drape: staged, gated, storage-aware training of try-on diffusion models.", no_args_is_help=True)
data_app = typer.Typer(help="Datasets: synthesize, shard, pre-stage.", no_args_is_help=True)
app.add_typer(data_app, name="data")
gate_app = typer.Typer(help="Validation gates, on outputs from anywhere.", no_args_is_help=True)
app.add_typer(gate_app, name="gate")
storage_app = typer.Typer(help="The object store: lifecycle rules, report, restore.", no_args_is_help=True)
app.add_typer(storage_app, name="storage")
queue_app = typer.Typer(help="The GPU queue: submit, list, cancel, dispatch, profile, simulate.", no_args_is_help=True)
app.add_typer(queue_app, name="queue")
console = Console() if sys.stdout.isatty() else Console(width=160)

ConfigOption = typer.Option(None, "--config", "-c", help="pipeline config YAML (default: configs/demo.yaml)")


def _load(config: Optional[Path]):
    try:
        return load_config(config or default_config_path())
    except ConfigError as error:
        console.print(f"[red]config error[/red]\n{error}")
        raise typer.Exit(2) from None


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console)


def _human(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(num_bytes) < 1024 or unit == "TB":
            return f"{num_bytes:.1f} {unit}" if unit != "B" else f"{int(num_bytes)} B"
        num_bytes /= 1024
    return str(num_bytes)


def _check_cell(check: dict) -> str:
    threshold = "unset" if check["threshold"] is None else f"{check['threshold']:.2f}"
    colour = "green" if check["passed"] else "red"
    return f"[{colour}]{check['value']:.3f}[/{colour}] ≥ {threshold}"  # value: the bootstrap lower bound


def print_summary(summary: dict, wall_seconds: float | None = None) -> None:
    """The end-of-run table and where to look next."""
    table = Table(title=f"drape run {summary['run_name']}", show_lines=False)
    for column in ("stage", "steps", "final loss", "train s", "data wait", "identity", "texture", "coherence", "verdict",
                   "snapshot", "archived", "live left"):
        table.add_column(column, justify="right" if column not in ("stage", "verdict") else "left")
    for row in summary["stages"]:
        checks = row["checks"]
        table.add_row(row["stage"], str(row["steps"]), f"{row['final_loss']:.4f}", f"{row['train_seconds']:.1f}",
                      f"{100 * row['data_wait_fraction']:.2f}%", *(_check_cell(checks[name]) for name in ("identity", "texture", "coherence")),
                      "[green]pass[/green]" if row["verdict"] == "pass" else "[red]FAIL[/red]", f"v{row['version']}",
                      _human(row["archived_bytes"]), _human(row["live_bytes"]))
    console.print(table)
    uri = summary["tracking_uri"]
    lines = [f"MLflow tracking URI: {uri}", f"  browse it: mlflow ui --backend-store-uri {uri}",
             f"Object store: {summary['object_store']}", f"Gate reports: {summary['gate_reports']}",
             f"Live storage left: {_human(summary['live_bytes'])}"]
    if wall_seconds is not None:
        lines.append(f"Wall time: {wall_seconds:.0f} s")
    console.print(Panel("\n".join(lines), title="where to look", expand=False))


def _run_flow(config_path: Path, mode: str, run_name: Optional[str]) -> None:
    import time

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "60")  # cold first start
    if os.environ.get("PREFECT_HOME"):  # Prefect's server cannot open its database in a missing folder
        Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
    _load(config_path)  # fail fast with a readable message before Prefect starts
    from drape.pipeline import GateFailed
    from flows.staged_training import staged_training

    started = time.perf_counter()
    try:
        summary = staged_training(config_path=str(config_path), mode=mode, run_name=run_name)
    except GateFailed as error:
        console.print(f"[red bold]run stopped:[/red bold] {error}")
        raise typer.Exit(1) from None
    print_summary(summary, time.perf_counter() - started)


@app.command()
def demo(run_name: Optional[str] = typer.Option(None, help="flow run name")) -> None:
    """Run the whole pipeline on the embedded demo config (CPU, a few minutes)."""
    _run_flow(default_config_path(), "full", run_name)


@app.command()
def run(config: Path = typer.Option(..., "--config", "-c", help="pipeline config YAML"),
        mode: str = typer.Option("full", help="full: each stage's steps; finetune: fine-tune passes from the baselines"),
        run_name: Optional[str] = typer.Option(None, help="flow run name")) -> None:
    """Run the staged-training flow on CONFIG."""
    if mode not in ("full", "finetune"):
        console.print(f"[red]--mode must be 'full' or 'finetune', got {mode!r}[/red]")
        raise typer.Exit(2)
    _run_flow(config, mode, run_name)


@app.command()
def serve(port: int = typer.Option(4200, help="Prefect server port"),
          home: Optional[Path] = typer.Option(None, help="PREFECT_HOME for the local server (default .drape/prefect-serve)")) -> None:
    """Start a local Prefect server, drape's work pools and deployments, and a `local` process worker."""
    import time

    from drape.serve import REPO, ServeError
    from drape.serve import serve as bring_up

    home = home or REPO / ".drape" / "prefect-serve"
    console.print(f"starting the Prefect server on http://127.0.0.1:{port} (PREFECT_HOME={home}) ...")
    try:
        stack = bring_up(home, port)
    except ServeError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(1) from None
    console.print(Panel("\n".join([
        f"Prefect UI:   {stack.ui_url}",
        "deployments:  staged-training/demo, staged-training/h100, staged-training/h100-finetune,",
        "              retention-sweep/weekly, prestage-dataset/demo, queue-dispatcher/demo",
        "worker:       pool 'local' (process); 'gpu-k8s' needs a kubernetes worker in the cluster",
        "",
        "try it (another shell):",
        f"  PREFECT_API_URL={stack.api_url} .venv/bin/prefect deployment run 'staged-training/demo' --watch",
        "",
        "Ctrl-C stops the worker and the server."]), title="drape serve", expand=False))
    try:
        while all(process.poll() is None for process in stack.processes.values()):
            time.sleep(1)
        console.print("[red]a process of the stack exited; see the logs in[/red] " + str(home))
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()


@data_app.command("synth")
def data_synth(config: Optional[Path] = ConfigOption,
               out: Optional[Path] = typer.Option(None, help="write shards to this local directory instead of the object store")) -> None:
    """Generate the synthetic try-on dataset as stage shards plus the control set."""
    from drape.data.dataset import build_dataset, dataset_prefix, ensure_dataset
    from drape.storage import open_store

    cfg = _load(config)
    sizes = {**cfg.data.samples_per_stage, "control": cfg.data.control_samples}
    with _progress() as progress:
        bars = {split: progress.add_task(f"synth {split}", total=count) for split, count in sizes.items()}
        advance = lambda split, n: progress.advance(bars[split], n)  # noqa: E731
        if out is not None:
            manifest = build_dataset(cfg, out, advance)
            where = str(out)
        else:
            store = open_store(cfg)
            manifest = ensure_dataset(cfg, store, advance)
            where = f"{store!r} {dataset_prefix(cfg)}"
    shards = sum(len(s) for s in manifest["splits"].values())
    console.print(f"dataset {manifest['name']}/{manifest['version']}: {shards} shards, control set {manifest['control_set']} → {where}")


def _weights(text: str) -> dict[str, float]:
    from drape import STAGES

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


@data_app.command("shard")
def data_shard(source: str = typer.Argument(..., help="'synth', or the root of a VITON-HD or DressCode tree"),
               out: str = typer.Option(..., help="object store URL (s3://bucket/prefix, file:///path or a path)"),
               config: Optional[Path] = ConfigOption,
               name: Optional[str] = typer.Option(None, help="dataset name (default: data.name)"),
               version: Optional[str] = typer.Option(None, help="dataset version (default: data.version)"),
               control: Optional[int] = typer.Option(None, help="control-set samples held apart (default: data.control_samples)"),
               weights: str = typer.Option("identity=1,texture=1,geometry=1,denoise=1",
                                           help="share of the other samples per stage, by hash of the pair key"),
               shard_max_bytes: Optional[int] = typer.Option(None, help="close a shard at this size (default: data.shard_max_bytes)"),
               shard_max_samples: Optional[int] = typer.Option(None, help="close a shard at this many samples")) -> None:
    """Cut SOURCE into datasets/<name>/<version>/<stage>/shard-NNNNN.tar + manifest.json at OUT."""
    import tempfile

    from drape.data.dataset import build_dataset, import_dataset, publish_dataset
    from drape.data.importers import SourceError
    from drape.storage import StorageError, open_store

    cfg = _load(config)
    name, version = name or cfg.data.name, version or cfg.data.version
    max_bytes, max_samples = shard_max_bytes or cfg.data.shard_max_bytes, shard_max_samples or cfg.data.shard_max_samples
    store = open_store(cfg, out)
    prefix = f"datasets/{name}/{version}"
    if store.exists(f"{prefix}/manifest.json"):
        console.print(f"[red]{store.key_url(prefix)} already exists[/red]; dataset versions are immutable, pick a new --version")
        raise typer.Exit(2)
    with tempfile.TemporaryDirectory(prefix="drape-shard-") as scratch, _progress() as progress:
        bar = progress.add_task(f"shard {source}", total=None)
        advance = lambda split, n: progress.advance(bar, n)  # noqa: E731
        try:
            if source == "synth":
                overrides = cfg.model_copy(update={"data": cfg.data.model_copy(update={
                    "name": name, "version": version, "shard_max_bytes": max_bytes, "shard_max_samples": max_samples,
                    **({"control_samples": control} if control else {})})})
                manifest = build_dataset(overrides, scratch, advance)
            else:
                manifest = import_dataset(source, scratch, name=name, version=version, resolution=cfg.data.resolution,
                                          control=control or cfg.data.control_samples, weights=_weights(weights),
                                          max_samples=max_samples, max_bytes=max_bytes, progress=advance)
            progress.update(bar, description=f"upload → {store!r}")
            publish_dataset(scratch, store, prefix)
        except (SourceError, ValueError, FileExistsError, StorageError) as error:
            console.print(f"[red]cannot shard {source}:[/red] {error}")
            raise typer.Exit(2) from None
    table = Table(title=f"dataset {name}/{version} → {store.key_url(prefix)}")
    for column in ("split", "shards", "samples", "bytes"):
        table.add_column(column, justify="left" if column == "split" else "right")
    for split, shards in manifest["splits"].items():
        table.add_row(split, str(len(shards)), str(sum(s["samples"] for s in shards)), _human(sum(s["bytes"] for s in shards)))
    console.print(table)
    console.print(f"control set {manifest['control_set']}; stage rule {manifest['stage_rule'].get('rule')}")


@data_app.command("prestage")
def data_prestage(stage: str = typer.Option(..., help="identity|texture|geometry|denoise|control"),
                  config: Optional[Path] = ConfigOption,
                  keep: str = typer.Option("control", help="comma-separated splits eviction must not touch")) -> None:
    """Pre-stage a stage's shards from the object store into the node-local shard cache (verified)."""
    from drape.data.cache import CacheError
    from drape.pipeline import prestage_dataset
    from drape.storage import StorageError

    cfg = _load(config)
    try:
        with _progress() as progress:
            bar = progress.add_task(f"prestage {stage}", total=None)
            result = prestage_dataset(cfg, stage, [s for s in keep.split(",") if s],
                                      progress=lambda done, total: progress.update(bar, completed=done, total=total))
    except FileNotFoundError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None
    except (CacheError, StorageError) as error:
        console.print(f"[red]prestage failed:[/red] {error}")
        raise typer.Exit(1) from None
    console.print(f"{stage}: {result['shards']} shards, {_human(result['bytes'])} in {result['directory']} "
                  f"({result['downloaded']} downloaded, {_human(result['downloaded_bytes'])}, {result['seconds']:.1f} s"
                  + (f"; evicted {len(result['evicted'])}" if result["evicted"] else "") + ")")


@app.command()
def train(config: Optional[Path] = ConfigOption, stage: str = typer.Option(..., help="identity|texture|geometry|denoise"),
          init: Optional[Path] = typer.Option(None, help="checkpoint to start from"),
          out: Optional[Path] = typer.Option(None, help="stage directory for checkpoints")) -> None:
    """Train one stage without an orchestrator (same code path as the flow's train task)."""
    from drape import train as trainer

    args = ["--config", str(config or default_config_path()), "--stage", stage]
    args += ["--init", str(init)] if init else []
    args += ["--out", str(out)] if out else []
    raise typer.Exit(trainer.main(args))


@gate_app.command("check")
def gate_check(control: Path = typer.Option(..., help="dataset root (with manifest.json) or a folder of control shards"),
               outputs: Path = typer.Option(..., help="folder of output PNGs named <control sample id>.png"),
               baseline_outputs: Optional[Path] = typer.Option(None, help="the last validated checkpoint's outputs, same names"),
               config: Optional[Path] = ConfigOption,
               stage: str = typer.Option("denoise", help="whose thresholds apply: identity|texture|geometry|denoise"),
               report: Optional[Path] = typer.Option(None, help="write the GateReport JSON here")) -> None:
    """Judge a folder of outputs on the control set. Exit 0 pass, 1 fail, 2 usage or input error."""
    import json

    from drape import STAGES
    from drape.data.dataset import load_control_dir
    from drape.data.shards import ShardError
    from drape.validate import judge, read_outputs

    cfg = _load(config)
    if stage not in STAGES:
        console.print(f"[red]--stage must be one of {', '.join(STAGES)}, got {stage!r}[/red]")
        raise typer.Exit(2)
    try:
        arrays, control_set = load_control_dir(control)
        produced = read_outputs(outputs, arrays["keys"])
        reference = read_outputs(baseline_outputs, arrays["keys"]) if baseline_outputs else None
    except (FileNotFoundError, ShardError, ValueError) as error:
        console.print(f"[red]input error:[/red] {error}")
        raise typer.Exit(2) from None
    baseline = {"version": str(baseline_outputs)} if baseline_outputs else None
    result = judge(cfg, stage=stage, run_id="gate-check", checkpoint=str(outputs), control=arrays, control_set=control_set,
                   outputs=produced, baseline_outputs=reference, baseline=baseline)
    table = Table(title=f"gate ({stage} thresholds) on {control_set}: {'PASS' if result.passed else 'FAIL'}")
    for column in ("check", "lower bound", "mean", "min", "threshold", "verdict"):
        table.add_column(column)
    for name, check in result.checks.items():
        threshold = "unset" if check.threshold is None else f"{check.threshold:.3f}"
        table.add_row(name, f"{check.lower:.3f}", f"{check.mean:.3f}", f"{check.minimum:.3f}", threshold,
                      "pass" if check.passed else "[red]FAIL[/red]")
    console.print(table)
    for line in result.failures():
        console.print(f"[red]- {line}[/red]")
    if report:
        report.write_text(json.dumps(result.to_dict(), indent=2))
    raise typer.Exit(0 if result.passed else 1)


@gate_app.command("calibrate")
def gate_calibrate(config: Optional[Path] = ConfigOption,
                   samples: int = typer.Option(200, help="control samples to synthesize (when --control is not given)"),
                   control: Optional[Path] = typer.Option(None, help="dataset root or folder of control shards"),
                   outputs: Optional[Path] = typer.Option(None, help="clean outputs named by sample id, e.g. a trained "
                                                          "stage's gate outputs (default: the targets)"),
                   baseline_outputs: Optional[Path] = typer.Option(None, help="judge coherence against these outputs "
                                                                   "(default: the ground truth, as a first run)"),
                   stage: str = typer.Option("denoise", help="whose configured thresholds to show beside the calibrated ones"),
                   false_alarm: float = typer.Option(0.01, help="false-alarm rate the thresholds are set for"),
                   redraws: int = typer.Option(300, help="control sets redrawn to calibrate the gate's lower bound")) -> None:
    """Per-check score distributions on clean outputs and a corruption suite, and the per-sample
    threshold that gives FALSE_ALARM, with each corruption's detection rate; then the same at the
    gate's level (the bootstrap lower bound of the mean, over redrawn control sets): the value
    thresholds a config takes."""
    import math

    from drape import STAGES
    from drape.calibrate import calibrate, gate_thresholds, render_gate_table, render_table
    from drape.data.dataset import load_control_dir, synthesize_split
    from drape.data.shards import ShardError
    from drape.validate import read_outputs

    cfg = _load(config)
    if not 0 < false_alarm < 0.5:
        console.print(f"[red]--false-alarm must be in (0, 0.5), got {false_alarm}[/red]")
        raise typer.Exit(2)
    if stage not in STAGES:
        console.print(f"[red]--stage must be one of {', '.join(STAGES)}, got {stage!r}[/red]")
        raise typer.Exit(2)
    if redraws < 20:
        console.print(f"[red]--redraws must be at least 20, got {redraws}[/red]")
        raise typer.Exit(2)
    try:
        arrays = load_control_dir(control)[0] if control else synthesize_split(cfg, "control", samples)
        clean = read_outputs(outputs, arrays["keys"]) if outputs else None
        reference = read_outputs(baseline_outputs, arrays["keys"]) if baseline_outputs else None
    except (FileNotFoundError, ShardError, ValueError) as error:
        console.print(f"[red]input error:[/red] {error}")
        raise typer.Exit(2) from None
    thresholds, rows = calibrate(cfg, arrays, clean_outputs=clean, reference_outputs=reference, false_alarm=false_alarm)
    source = f"outputs in {outputs}" if outputs else "control targets"
    versus = f"baseline outputs in {baseline_outputs}" if baseline_outputs else "the ground truth"
    console.print(render_table(thresholds, rows, false_alarm=false_alarm,
                               title=f"per sample: {len(arrays['keys'])} samples, clean = {source}, coherence vs {versus}"))
    gate, gate_rows = gate_thresholds(rows, false_alarm=false_alarm, redraws=redraws)
    configured = cfg.gates.thresholds(stage, vs_baseline=baseline_outputs is not None)
    console.print(render_gate_table(gate, gate_rows, false_alarm=false_alarm, configured=configured,
                                    title=f"gate level: bootstrap lower bound over {redraws} redrawn control sets; "
                                          f"configured = {stage} thresholds in {config or 'the default config'}"))
    keys = {"identity": "gates.identity.min_similarity", "texture": "gates.texture.min_fidelity",
            "coherence": "gates.coherence.min_score_vs_baseline" if baseline_outputs else "gates.coherence.min_score"}
    for check, value in gate.items():
        console.print(f"{keys[check]}: {math.floor(value * 100) / 100:.2f}   "
                      f"# {stage}: {false_alarm:.1%} false alarms at the gate (drape gate calibrate)")


@storage_app.command("apply-lifecycle")
def storage_apply_lifecycle(config: Optional[Path] = ConfigOption) -> None:
    """Write the bucket lifecycle rules generated from the retention policy (s3:// stores)."""
    from drape.lifecycle import apply_lifecycle
    from drape.storage import StorageError, open_store

    cfg = _load(config)
    try:
        rules = apply_lifecycle(open_store(cfg), cfg.retention)
    except StorageError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None
    table = Table(title=f"lifecycle rules on {open_store(cfg)!r} (read back from S3)")
    for column in ("rule", "prefix", "tags", "expires after"):
        table.add_column(column)
    for rule in rules:
        selector = rule["Filter"].get("And", rule["Filter"])
        tags = ", ".join(f"{t['Key']}={t['Value']}" for t in selector.get("Tags", []))
        expires = (f"{rule['Expiration']['Days']} days" if "Expiration" in rule
                   else f"noncurrent versions after {rule['NoncurrentVersionExpiration']['NoncurrentDays']} days")
        table.add_row(rule["ID"], selector.get("Prefix", ""), tags, expires)
    console.print(table)


@storage_app.command("report")
def storage_report_command(config: Optional[Path] = ConfigOption) -> None:
    """Live bytes by kind, archived bytes by kind/outcome/class, modelled monthly cost, next expiries."""
    from drape.pipeline import live_root
    from drape.storage import open_store
    from drape.storage_report import storage_report

    cfg = _load(config)
    report = storage_report(cfg, open_store(cfg), live_root(cfg))
    table = Table(title="storage")
    for column in ("where", "kind / outcome / class", "bytes"):
        table.add_column(column)
    for kind, size in sorted(report["live_bytes"].items()):
        table.add_row("live", kind, _human(size))
    for key, size in report["archived_bytes"].items():
        table.add_row("archive", key, _human(size))
    console.print(table)
    cost = report["monthly_cost_usd"]
    console.print(f"modelled monthly cost: live ${cost['live']:.4f} + archive ${cost['archive']:.4f} = ${cost['total']:.4f}")
    for item in report["expires_next"]:
        console.print(f"expires {item['expires_at'][:10]}: {item['key']} ({_human(item['bytes'])})")


@storage_app.command("sweep")
def storage_sweep(config: Optional[Path] = ConfigOption,
                  dry_run: bool = typer.Option(False, help="say what would change, change nothing")) -> None:
    """Retag superseded baselines and delete expired objects where lifecycle rules cannot (file://)."""
    from drape import pipeline

    cfg = _load(config)
    result = pipeline.sweep(cfg, dry_run=dry_run)
    verb = "would retag" if dry_run else "retagged"
    console.print(f"{verb} {len(result['retagged'])} superseded baseline object(s); "
                  f"{'would delete' if dry_run else 'deleted'} {len(result['deleted'])} expired object(s) "
                  f"({_human(result['freed_bytes'])})")


@storage_app.command("restore")
def storage_restore(run_id: str = typer.Argument(..., help="run id (as in the archive manifest)"),
                    stage: str = typer.Argument(..., help="identity|texture|geometry|denoise"),
                    config: Optional[Path] = ConfigOption,
                    out: Optional[Path] = typer.Option(None, help="destination (default <root>/live/restored/RUN/STAGE)")) -> None:
    """Bring a stage's archived snapshot back to live storage, verified, for resume or audit."""
    from drape.pipeline import live_root
    from drape.storage import StorageError, open_store
    from drape.storage_report import restore_stage

    cfg = _load(config)
    destination = out or live_root(cfg) / "restored" / run_id / stage
    try:
        files = restore_stage(open_store(cfg), run_id, stage, destination)
    except (FileNotFoundError, StorageError) as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None
    console.print(f"restored {len(files)} files ({_human(sum(f.stat().st_size for f in files))}) to {destination}")


@queue_app.command("submit", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def queue_submit(ctx: typer.Context, kind: str = typer.Option(..., help="stage-training|finetune|gate-eval|inference-benchmark|personalization"),
                 mem_gib: float = typer.Option(..., help="peak GPU memory per GPU (GiB)"),
                 duration: float = typer.Option(3600.0, help="expected run time (s)"),
                 gpus: int = typer.Option(1, help="GPUs (more than one: whole GPUs on one node)"),
                 priority: int = typer.Option(3, help="higher runs first; waiting raises it (aging)"),
                 stage: Optional[str] = typer.Option(None), config: Optional[Path] = ConfigOption) -> None:
    """Queue the command after `--` (e.g. drape queue submit --kind gate-eval --mem-gib 12 -- python -m x)."""
    from scheduler.store import JobSpec, JobStore, QueueError

    cfg = _load(config)
    if not ctx.args:
        console.print("[red]no command: put it after --[/red]")
        raise typer.Exit(2)
    try:
        job_id = JobStore(cfg.queue_url).submit(JobSpec(kind=kind, command=list(ctx.args), mem_gib=mem_gib, duration_s=duration,
                                                        gpus=gpus, priority=priority, stage=stage))
    except QueueError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None
    console.print(job_id)


@queue_app.command("list")
def queue_list(config: Optional[Path] = ConfigOption, state: Optional[str] = typer.Option(None, help="only jobs in this state"),
               limit: int = typer.Option(50)) -> None:
    """Jobs, oldest first, with state, GPUs, memory and waits."""
    import json
    import time

    from scheduler.store import JobStore

    store = JobStore(_load(config).queue_url)
    table = Table(title=f"queue: {', '.join(f'{k} {v}' for k, v in store.counts().items() if v)}")
    for column in ("job", "kind", "stage", "state", "prio", "gpus", "mem GiB", "waited", "on"):
        table.add_column(column)
    now = time.time()
    for job in store.jobs((state,) if state else None, limit):
        waited = (job["start_s"] or now) - job["submit_s"]
        table.add_row(job["id"], job["kind"], job["stage"] or "", job["state"], str(job["priority"]), str(job["gpus"]),
                      f"{job['mem_gib']:.1f}", f"{waited:.0f} s", ", ".join(json.loads(job["assigned"] or "[]")))
    console.print(table)


@queue_app.command("cancel")
def queue_cancel(job_id: str = typer.Argument(...), config: Optional[Path] = ConfigOption) -> None:
    """Cancel a queued job, or stop a running one (its dispatcher ends it on its next cycle)."""
    from scheduler.store import JobStore, QueueError

    try:
        job = JobStore(_load(config).queue_url).cancel(job_id)
    except QueueError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None
    console.print(f"{job_id}: {job['state']}")


@queue_app.command("dispatch")
def queue_dispatch(config: Optional[Path] = ConfigOption, once: bool = typer.Option(False, help="one cycle, then exit"),
                   metrics_port: Optional[int] = typer.Option(None, help="serve Prometheus /metrics on this port")) -> None:
    """Run a dispatcher: place queued jobs on idle capacity, launch them, reap them."""
    from scheduler.dispatcher import Dispatcher

    cfg = _load(config)
    if metrics_port:
        from prometheus_client import start_http_server

        from drape.metrics import REGISTRY

        start_http_server(metrics_port, registry=REGISTRY)
        console.print(f"metrics on http://0.0.0.0:{metrics_port}/metrics")
    dispatcher = Dispatcher(cfg)
    console.print(f"dispatcher {dispatcher.id}: policy {cfg.queue.policy}, fleet {cfg.queue.fleet}, launcher {cfg.queue.launcher}")

    def show(report) -> None:
        if report.started or report.finished or report.requeued:
            console.print(f"started {len(report.started)}, finished {len(report.finished)}, requeued {len(report.requeued)} "
                          f"({report.seconds * 1000:.0f} ms, fleet: {report.fleet_source})")

    try:
        dispatcher.run(max_cycles=1 if once else None, on_cycle=show)
    except KeyboardInterrupt:
        console.print("dispatcher stopped; its running jobs keep their leases until they lapse")


@queue_app.command("profile")
def queue_profile(config: Optional[Path] = ConfigOption) -> None:
    """Memory profiles per job kind and stage: the estimate from the config vs the measured history."""
    from drape import STAGES
    from scheduler.profiles import parameter_counts, profile
    from scheduler.store import JobStore

    cfg = _load(config)
    store = JobStore(cfg.queue_url)
    table = Table(title=f"memory profiles: {cfg.name} ({cfg.data.resolution} px, batch {cfg.train.batch_size}, {cfg.train.precision})")
    for column in ("kind", "stage", "estimate GiB", "est. duration", "measured p95 GiB", "runs", "queue uses GiB", "from"):
        table.add_column(column)
    for kind in ("stage-training", "finetune", "gate-eval"):
        for stage in STAGES:
            p = profile(cfg, store, kind, stage, counts=parameter_counts(cfg, stage))
            measured = "-" if p.measured_p95_gib is None else f"{p.measured_p95_gib:.2f}"
            table.add_row(kind, stage, f"{p.estimate_gib:.2f}", f"{p.estimate_duration_s / 60:.1f} min", measured,
                          str(p.measurements), f"{p.mem_gib:.2f}", p.source)
    console.print(table)


@queue_app.command("simulate")
def queue_simulate(trace: Path = typer.Option(..., help="CSV: job_id,submit_s,duration_s,peak_mem_gib,gpus,priority,kind"),
                   fleet: Path = typer.Option(..., help="fleet YAML: groups: [{model, memory_gib, nodes, gpus_per_node}]"),
                   policy: str = typer.Option("fifo-exclusive,drape", help="policies to compare, comma-separated")) -> None:
    """Replay a trace against a fleet with the live policy code; utilization, waits, starvation, bound."""
    from scheduler.policy import POLICIES
    from scheduler.simulator import TraceError, load_fleet, load_trace, render, simulate

    names = [p for p in policy.split(",") if p]
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        console.print(f"[red]unknown policy {unknown}; expected some of {sorted(POLICIES)}[/red]")
        raise typer.Exit(2)
    try:
        jobs, gpus = load_trace(trace), load_fleet(fleet)
        results = [simulate(jobs, gpus, name) for name in names]
    except TraceError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None
    print(render(results))


def main() -> None:  # pragma: no cover - console entry point
    sys.exit(app())
