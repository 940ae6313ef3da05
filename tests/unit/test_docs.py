"""The documentation site's generated references (docs/hooks.py) cover the code they describe."""

from __future__ import annotations

import importlib.util
import typing
from typing import Literal

import pytest
import typer
from pydantic import BaseModel, Field

from tests.conftest import TESTS

REPO = TESTS.parent
UNDOCUMENTED_FIELDS_AT_MOST = 96  # a ratchet: new config fields come with a description (a section: its docstring)


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _leaf_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    paths = set()
    for name, field in model.model_fields.items():
        paths.add(f"{prefix}{field.alias or name}")
        for nested in typing.get_args(field.annotation) or (field.annotation,):
            if isinstance(nested, type) and issubclass(nested, BaseModel):
                paths |= _leaf_paths(nested, f"{prefix}{field.alias or name}.")
    return paths


def test_the_config_reference_lists_every_field_with_type_default_and_bounds(hooks):
    from drape.config import PipelineConfig

    page, fields, undocumented = hooks.config_reference(PipelineConfig)
    sections = {path for path, _ in hooks.config_sections(PipelineConfig)}
    assert {"storage", "train", "train.lora", "queue", "gates"} <= sections
    for path in _leaf_paths(PipelineConfig):  # every field is a row of its section's table
        section, _, name = path.rpartition(".")
        assert f"## `{section or '(top level)'}`" in page and f"| `{name}` |" in page, path
    assert fields >= len(_leaf_paths(PipelineConfig))
    assert "| `multipart_chunk_bytes` | int | `67108864` | ≥ 5242880 | S3 multipart part size |" in page
    assert undocumented <= UNDOCUMENTED_FIELDS_AT_MOST, f"{undocumented} config fields have no description"


def test_the_config_reference_renders_types_defaults_and_bounds(hooks):
    class Inner(BaseModel):
        """An inner section."""

        kind: Literal["a", "b"] = "a"

    class Outer(BaseModel):
        count: int = Field(default=3, ge=1, le=8, description="how many | at most 8")
        ratio: float | None = None
        names: list[str] = Field(default_factory=lambda: ["x"])
        inner: Inner = Inner()
        needed: str

    page, fields, undocumented = hooks.config_reference(Outer)
    assert (fields, undocumented) == (6, 4)  # `inner` is described by its docstring
    assert "| `count` | int | `3` | ≥ 1, ≤ 8 | how many \\| at most 8 |" in page
    assert "| `ratio` | float \\| null | `null` |" in page and "| `names` | list[str] | `['x']` |" in page
    assert "| `needed` | str | `required` |" in page
    assert "## `inner`" in page and "An inner section." in page and "| `kind` | 'a' \\| 'b' | `'a'` |" in page


def test_the_cli_reference_lists_every_command_and_option_with_help(hooks):
    from drape.cli import app

    command = typer.main.get_command(app)
    page, options, undocumented = hooks.cli_reference(command)
    for path, _ in hooks._commands(command, ["drape"]):
        assert f"## `{' '.join(path)}`" in page
    assert "## `drape queue submit`" in page and "| `--mem-gib` |" in page and "| `--config`, `-c` |" in page
    assert options > 100 and undocumented == 0, f"{undocumented} CLI options have no help"
