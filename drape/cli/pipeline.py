"""`drape demo`, `drape run`, `drape serve`, `drape train`: the pipeline as a whole, or one stage."""

from __future__ import annotations

import os
import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.panel import Panel

from drape import MODES, Mode, parse_mode
from drape.cli.common import ConfigOption, console, fail, load, stage_option
from drape.cli.render import print_summary
from drape.config import default_config_path


def _run_flow(config_path: Path, mode: str, run_name: str | None, resume: str | None = None) -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "60")  # cold first start
    if os.environ.get("PREFECT_HOME"):  # Prefect's server cannot open its database in a missing folder
        Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
    config = load(config_path)  # fail fast with a readable message before Prefect starts
    if resume:
        _refuse_if_driven(config, resume)
    from drape.gates.recognizers import ControlSetError
    from drape.pipeline import GateFailed, ResumeError
    from drape.storage.lease import LeaseLost, RunHeld
    from flows.budget import PrefectUnavailable, client_budget
    from flows.staged_training import staged_training

    started = time.perf_counter()
    try:
        with client_budget(config.orchestration.max_wait_seconds):
            summary = staged_training(config_path=str(config_path), mode=mode, run_name=run_name, resume=resume)
    except PrefectUnavailable as error:  # a service down, not bad input: exit 1, one line, no traceback
        console.print(f"[red bold]drape: error:[/red bold] {escape(str(error))}")
        raise typer.Exit(1) from None
    except (GateFailed, LeaseLost) as error:
        console.print(f"[red bold]run stopped:[/red bold] {escape(str(error))}")
        raise typer.Exit(1) from None
    except (ResumeError, ControlSetError, RunHeld) as error:  # input errors: exit 2 (a failed gate is 1)
        fail(str(error))
    print_summary(summary, time.perf_counter() - started)


def _refuse_if_driven(config, run_id: str) -> None:
    """Exit 2 before Prefect starts when another live process drives the run (its lease); the flow's
    start takes the lease itself, so two starts at the same moment are still decided there."""
    from drape.layout import safe_name
    from drape.storage.lease import refusal
    from drape.storage.network import StorageError
    from drape.storage.store import open_store

    try:
        held = refusal(open_store(config), safe_name(run_id, "--resume run id"))
    except ValueError as error:
        fail(str(error))
    except StorageError:
        return  # the store unreachable a moment: the flow's start, with its retries, decides
    if held is not None:
        fail(str(held))


def demo(run_name: str | None = typer.Option(None, help="flow run name")) -> None:
    """Run the whole pipeline on the embedded demo config (CPU, a few minutes)."""
    _run_flow(default_config_path(), Mode.FULL, run_name)


def run(
    config: Path = typer.Option(..., "--config", "-c", help="pipeline config YAML"),
    mode: str = typer.Option("full", help=f"{'|'.join(MODES)}: each stage's steps, or fine-tune passes from the baselines"),
    run_name: str | None = typer.Option(None, help="flow run name"),
    resume: str | None = typer.Option(
        None, help="a run id to resume where it stopped: promoted stages are kept, the stage in progress resumes"
    ),
) -> None:
    """Run the staged-training flow on CONFIG (or resume a run that died, with --resume RUN_ID)."""
    try:
        parse_mode(mode, what="--mode")
    except ValueError as error:
        fail(str(error))
    _run_flow(config, mode, run_name, resume)


def serve(
    port: int = typer.Option(4200, help="Prefect server port"),
    home: Path | None = typer.Option(None, help="PREFECT_HOME for the local server (default .drape/prefect-serve)"),
) -> None:
    """Start a local Prefect server, drape's work pools and deployments, and a `local` process worker."""
    from drape.cli.stack import REPO, ServeError
    from drape.cli.stack import serve as bring_up

    home = home or REPO / ".drape" / "prefect-serve"
    console.print(f"starting the Prefect server on http://127.0.0.1:{port} (PREFECT_HOME={home}) ...")
    stack = None
    try:  # one block from the bring-up on: a SIGTERM just after the banner must stop the stack too
        stack = bring_up(home, port)  # stops what it started if interrupted itself
        _serve_banner(stack)
        while all(process.poll() is None for process in stack.processes.values()):
            time.sleep(1)
        console.print("[red]a process of the stack exited; see the logs in[/red] " + str(home))
    except ServeError as error:
        fail(str(error), 1)
    except KeyboardInterrupt:
        pass
    finally:
        if stack is not None:
            stack.stop()


def _serve_banner(stack) -> None:
    """Where the running stack is, and what to try."""
    console.print(
        Panel(
            "\n".join(
                [
                    f"Prefect UI:   {stack.ui_url}",
                    "deployments:  every one in deployments/prefect.yaml (`prefect deployment ls`)",
                    "worker:       pool 'local' (process); 'gpu-k8s' and 'slurm-login' need their own workers",
                    "",
                    "try it (another shell):",
                    f"  PREFECT_API_URL={stack.api_url} .venv/bin/prefect deployment run 'staged-training/demo' --watch",
                    "",
                    "Ctrl-C stops the worker and the server.",
                ]
            ),
            title="drape serve",
            expand=False,
        )
    )


def train(
    config: Path | None = ConfigOption,
    stage: str = stage_option(..., "identity|texture|geometry|denoise"),
    init: Path | None = typer.Option(
        None,
        help="checkpoint to start from: a drape checkpoint, or CatVTON's release (a folder with attention/model.safetensors)",
    ),
    out: Path | None = typer.Option(None, help="stage directory for checkpoints"),
) -> None:
    """Train one stage without an orchestrator (same code path as the flow's train task)."""
    from drape.training.jobs.stage_job import main

    args = ["--config", str(config or default_config_path()), "--stage", stage]
    args += ["--init", str(init)] if init else []
    args += ["--out", str(out)] if out else []
    raise typer.Exit(main(args))
