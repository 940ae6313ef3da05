"""What every `drape` command shares: the console, the --config option, loading a config or exiting 2,
progress bars, and leaving with a red message and an exit code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from drape import parse_stage
from drape.config import ConfigError, PipelineConfig, default_config_path, load_config

console = Console() if sys.stdout.isatty() else Console(width=160)

ConfigOption = typer.Option(None, "--config", "-c", help="pipeline config YAML (default: configs/demo.yaml)")


def load(config: Path | None) -> PipelineConfig:
    """The config at `config` (default: the demo's); a readable error and exit 2 when it is bad."""
    try:
        return load_config(config or default_config_path())
    except ConfigError as error:
        console.print(f"[red]config error[/red]\n{escape(str(error))}")
        raise typer.Exit(2) from None


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `message` in red and exit with `code` (2: usage or input error, 1: the work failed)."""
    console.print(f"[red]{escape(message)}[/red]")  # messages quote fields like `stages.x.[key]`: not markup
    raise typer.Exit(code)


def _stage(value: str | None) -> str | None:
    try:
        return None if value is None else parse_stage(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def stage_option(default, help: str):
    """A --stage option that accepts only the four stages (exit 2 otherwise)."""
    return typer.Option(default, help=help, callback=_stage)


stage_argument = _stage  # the same check for a STAGE argument


def progress_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console)
