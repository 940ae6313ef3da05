"""What every `drape` command shares: the console, the --config option, loading a config or exiting 2,
progress bars, and leaving with a red message and an exit code."""

from __future__ import annotations

import functools
import inspect
import math
import os
import sys
from pathlib import Path
from typing import NoReturn

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from typer.exceptions import TyperException

from drape import parse_stage
from drape.config import ConfigError, PipelineConfig, default_config_path, load_config
from drape.secrets import redact

console = Console() if sys.stdout.isatty() else Console(width=160)

ConfigOption = typer.Option(None, "--config", "-c", help="pipeline config YAML (default: configs/demo.yaml)")


def load(config: Path | None, site: Path | None = None) -> PipelineConfig:
    """The config at `config` (default: the demo's; `site`: the site file in place of $DRAPE_SITE); a
    readable error and exit 2 when it is bad."""
    try:
        return load_config(config or default_config_path(), site=site)
    except ConfigError as error:
        console.print(f"[red]config error[/red]\n{escape(str(error))}")
        raise typer.Exit(2) from None


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `message` (redacted) in red and exit with `code` (2: usage or input error, 1: the work failed)."""
    console.print(f"[red]{escape(redact(message))}[/red]")  # messages quote fields like `stages.x.[key]`: not markup
    raise typer.Exit(code)


def _check_numbers(options: dict, defaults: dict) -> None:
    """A usage error (exit 2) naming the flag for a number no machine or plan holds: infinite, NaN,
    or beyond the config's ceiling for a field of that name (`drape.config.base.CEILINGS`)."""
    from drape.config.base import check_model_shape

    for name, value in options.items():
        declared = defaults.get(name)
        if isinstance(value, int) and getattr(declared, "min", None) is not None and getattr(declared, "max", None) is not None:
            continue  # an integer bounded both ways where it is declared (a priority may be negative): not a size
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            try:
                check_model_shape({name: [v for v in values if isinstance(v, (int, float))]}, "flag")
            except ValueError as error:
                reason = str(error).split(": ", 2)[-1]
                declared = getattr(defaults.get(name), "param_decls", None) or [f"--{name.replace('_', '-')}"]
                raise typer.BadParameter(reason, param_hint=declared[0]) from None


def finite(flag: str, low: float | None = None, high: float | None = None):
    """A parser for the float option `flag`: a finite number in [low, high], else a usage error (exit 2)
    naming the flag, that says "a finite number" for nan (whose every comparison is false, so a bound
    alone would name the wrong rule)."""

    def parse(text: object) -> float:
        try:
            value = float(text)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise typer.BadParameter(f"expected a number, got {text!r}", param_hint=flag) from None
        shown = f" in [{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}]"
        if not math.isfinite(value):
            raise typer.BadParameter(f"expected a finite number{shown}, got {text}", param_hint=flag)
        if (low is not None and value < low) or (high is not None and value > high):
            raise typer.BadParameter(f"expected a number{shown}, got {value:g}", param_hint=flag)
        return value

    return parse


def _friendly(function):
    """`function` with every error it lets out turned into one red, redacted line and exit 1 (no
    traceback quoting URLs or keys); ``DRAPE_DEBUG=1`` lets the traceback through."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        _check_numbers(kwargs, {name: p.default for name, p in inspect.signature(function).parameters.items()})
        try:
            return function(*args, **kwargs)
        except (typer.Exit, typer.Abort, TyperException, click.exceptions.ClickException, KeyboardInterrupt):
            raise  # usage errors and exits keep their codes
        except Exception as error:  # noqa: BLE001 - the command's last word: a message, never a traceback
            if os.environ.get("DRAPE_DEBUG"):
                raise
            hint = ""
            if type(error).__module__.startswith(("botocore", "urllib3", "aiobotocore")):
                hint = (
                    " (is storage.endpoint_url right and the endpoint up? each S3 request waits up to storage.max_wait_seconds)"
                )
            fail(redact(f"{type(error).__name__}: {error}{hint}"), 1)

    return wrapper


class Typer(typer.Typer):
    """typer.Typer whose commands end with a message, not a traceback (`_friendly`)."""

    def command(self, *args, **kwargs):
        register = super().command(*args, **kwargs)
        return lambda function: register(_friendly(function))


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
