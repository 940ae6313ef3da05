"""MkDocs hook: the config and CLI references and the lists other pages show, generated at build time
from the code itself, and the benchmarks page, read from benchmarks/README.md (one copy, beside the
benchmarks).

`reference/config.md` walks the pydantic models under `PipelineConfig` (every field: its YAML path,
type, default, bounds and description); `reference/cli.md` walks the `drape` command (every command:
usage, help, options). A page lists deployments, configs, commands or make targets by a marker on a
line of its own, `<!-- generated: deployments -->` (or `configs`, `commands`, `make-targets`), which
the build replaces with a table read from deployments/prefect.yaml, the files under configs/, the
`drape` command and the Makefile. Nothing is hand-copied, so the pages cannot drift from the code; a
field or option without a description shows as such (tests/unit/test_docs.py counts them).
"""

from __future__ import annotations

import ast
import json
import posixpath
import re
import types
import typing
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

CONFIG_PAGE = "reference/config.md"
CLI_PAGE = "reference/cli.md"
BENCHMARKS_PAGE = "benchmarks.md"  # benchmarks/README.md, where the benchmarks and their tables live
REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "length ≥"), ("max_length", "length ≤"))


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic models an annotation holds (itself, or inside Optional, list, dict, …)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _models_in(argument)


def type_name(annotation: Any) -> str:
    """A field's type as a reader writes it in YAML terms: `int`, `str | None`, `list[float]`, `'a' | 'b'`."""
    if annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(value) for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(argument) for argument in typing.get_args(annotation))
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin is not None:
        arguments = ", ".join(type_name(argument) for argument in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{arguments}]"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(repr(member.value) for member in annotation)
    return getattr(annotation, "__name__", str(annotation))


def default_text(field: FieldInfo) -> str:
    """The default as YAML would spell it; `required` where there is none."""
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, Enum):
        value = value.value
    text = "null" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


def bounds_text(field: FieldInfo) -> str:
    """`≥ 1, ≤ 64` from the field's constraints (pydantic's annotated-types metadata)."""
    found = []
    for item in field.metadata:
        for attribute, sign in BOUNDS:
            value = getattr(item, attribute, None)
            if value is not None:
                found.append(f"{sign} {value}")
    return ", ".join(found)


def _cell(text: str) -> str:
    """Text for a table cell: pipes escaped, one line, `<` outside code spans shown, not read as HTML."""
    parts = re.split(r"(`[^`]*`)", text.replace("|", "\\|").replace("\n", " "))
    return "".join(part if part.startswith("`") else part.replace("<", "&lt;") for part in parts) or " "


def config_sections(model: type[BaseModel], path: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    """(YAML path, model) for `model` and every model nested under it, depth first, each once per path."""
    yield path, model
    for name, field in model.model_fields.items():
        key = field.alias or name
        for nested in dict.fromkeys(_models_in(field.annotation)):
            yield from config_sections(nested, f"{path}.{key}" if path else key)


def _site_fields() -> tuple[str, ...]:
    from drape.config.reading.site import SITE_FIELDS

    return SITE_FIELDS


def config_reference(root: type[BaseModel]) -> tuple[str, int, int]:
    """The config reference page; (markdown, fields, fields without a description)."""
    lines = [
        "# Config reference",
        "",
        "Generated from the pydantic models in `drape/config/` when the site is built. A pipeline config",
        "is a YAML file of these sections; unknown keys are errors, and a bad value fails at load naming",
        "the field and the file.",
        "",
        "A config file may name others under `extends:` (one file or a list, relative to it): they are merged",
        "in order, then its own keys on top (`drape/config/reading/extends.py`). A config that names site values under",
        "`site:` (each `required` or `optional`) takes them from the site file `DRAPE_SITE` or `drape --site`",
        "names (a copy of `configs/site.example.yaml`; `drape/config/reading/site.py`). The site values: "
        + ", ".join(f"`{field}`" for field in _site_fields())
        + ".",
        "",
    ]
    fields = undocumented = 0
    for path, model in config_sections(root):
        lines += [f"## `{path or '(top level)'}`", ""]
        doc = (model.__doc__ or "").strip()
        if doc and not doc.startswith(("A base class", "Usage docs")):
            lines += [" ".join(doc.split()), ""]
        lines += ["| field | type | default | bounds | description |", "| --- | --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            fields += 1
            sections = [m for m in _models_in(field.annotation) if (m.__doc__ or "").strip()]
            undocumented += not (field.description or sections)  # a section is described by its model's docstring
            key = field.alias or name
            row = (
                f"`{key}`",
                type_name(field.annotation),
                f"`{default_text(field)}`",
                bounds_text(field),
                field.description or "",
            )
            lines.append("| " + " | ".join(_cell(cell) for cell in row) + " |")
        lines.append("")
    return "\n".join(lines), fields, undocumented


def _commands(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    """(words, command) of `command` and every subcommand; typer's vendored click or click alike."""
    yield path, command
    subcommands = getattr(command, "commands", None) or {}
    for name in sorted(subcommands):
        yield from _commands(subcommands[name], [*path, name])


def cli_reference(command: Any, name: str = "drape") -> tuple[str, int, int]:
    """The CLI reference page; (markdown, options, options without help)."""
    lines = ["# CLI reference", "", "Generated from the `drape` command when the site is built.", ""]
    options = undocumented = 0
    for path, sub in _commands(command, [name]):
        context = sub.context_class(sub, info_name=" ".join(path))
        lines += [
            f"## `{' '.join(path)}`",
            "",
            " ".join((sub.help or "").split()),
            "",
            "```text",
            sub.get_usage(context),
            "```",
            "",
        ]
        rows = []
        for parameter in sub.get_params(context):
            if parameter.param_type_name != "option" or getattr(parameter, "hidden", False) or parameter.name == "help":
                continue
            options += 1
            undocumented += not parameter.help
            names = ", ".join(f"`{option}`" for option in [*parameter.opts, *parameter.secondary_opts])
            default = "" if parameter.default in (None, ()) or callable(parameter.default) else f"`{parameter.default!r}`"
            rows.append(f"| {names} | {_cell(default)} | {_cell(' '.join((parameter.help or '').split()))} |")
        if rows:
            lines += ["| option | default | help |", "| --- | --- | --- |", *rows, ""]
    return "\n".join(lines), options, undocumented


# --- the lists other pages show: deployments, configs, commands, make targets ------------------------
def first_sentence(text: str) -> str:
    """The first sentence of a paragraph, its lines joined: what a one-line table cell shows."""
    paragraph = " ".join(text.strip().split("\n\n")[0].split())
    for end in re.finditer(r"[.!?](?=\s)", paragraph):
        if not paragraph[: end.end()].endswith(("e.g.", "i.e.", "etc.", "vs.", "cf.")):
            return paragraph[: end.end()]
    return paragraph


def flow_names(repo: Path = REPO) -> dict[str, str]:
    """`flows/file.py:function` → the flow's name (its `@flow(name=...)`), read without importing Prefect."""
    names = {}
    for path in sorted((repo / "flows").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for decorator in node.decorator_list:
                keywords = decorator.keywords if isinstance(decorator, ast.Call) else []
                for keyword in keywords:
                    value = keyword.value.value if isinstance(keyword.value, ast.Constant) else None
                    if keyword.arg == "name" and isinstance(value, str):
                        names[f"flows/{path.name}:{node.name}"] = value
    return names


def deployments(repo: Path = REPO) -> list[dict[str, str]]:
    """Every deployment of deployments/prefect.yaml: `flow/name`, work pool, parameters, schedule, description."""
    import yaml

    flows = flow_names(repo)
    found = []
    for item in yaml.safe_load((repo / "deployments" / "prefect.yaml").read_text())["deployments"]:
        parameters = item.get("parameters") or {}
        schedules = [entry.get("cron", "") for entry in item.get("schedules") or []]
        found.append(
            {
                "name": f"{flows.get(item['entrypoint'], item['entrypoint'])}/{item['name']}",
                "pool": item["work_pool"]["name"],
                "parameters": ", ".join(f"{key}: {json.dumps(value).strip(chr(34))}" for key, value in parameters.items()),
                "schedule": ", ".join(f"cron `{cron}`" for cron in schedules),
                "description": item.get("description", ""),
            }
        )
    return found


def deployments_table(repo: Path = REPO) -> str:
    rows = ["| deployment | work pool | parameters | what it runs |", "| --- | --- | --- | --- |"]
    for item in deployments(repo):
        what = "; ".join(text for text in (item["description"], item["schedule"]) if text)
        rows.append(f"| `{item['name']}` | `{item['pool']}` | {_cell(item['parameters'])} | {_cell(what)} |")
    return "\n".join(rows)


def config_files(repo: Path = REPO) -> list[tuple[str, str]]:
    """(path, first sentence of its leading comment) for every YAML file under configs/, folders included."""
    found = []
    for path in sorted((repo / "configs").rglob("*.y*ml")):
        comment = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            comment.append(line.lstrip("#").strip())
        found.append((path.relative_to(repo).as_posix(), first_sentence("\n".join(comment))))
    return found


def configs_table(repo: Path = REPO) -> str:
    rows = ["| config | what it is (from its opening comment) |", "| --- | --- |"]
    rows += [f"| `{path}` | {_cell(summary)} |" for path, summary in config_files(repo)]
    return "\n".join(rows)


def commands_table(command: Any, page: str) -> str:
    """Every leaf `drape` command, what it does (its help's first sentence), linked to the CLI reference."""
    reference = posixpath.relpath(CLI_PAGE, posixpath.dirname(page) or ".")
    rows = ["| command | what it does |", "| --- | --- |"]
    for path, sub in _commands(command, ["drape"]):
        if getattr(sub, "commands", None):
            continue
        words = " ".join(path)
        link = f"[`{words}`]({reference}#{'-'.join(path)})"
        rows.append(f"| {link} | {_cell(first_sentence(sub.help or ''))} |")
    return "\n".join(rows)


def make_targets(repo: Path = REPO) -> list[tuple[str, str]]:
    """(target, description) for every .PHONY target of the Makefile: the comment line right above it."""
    lines = (repo / "Makefile").read_text().splitlines()
    phony = [word for line in lines if line.startswith(".PHONY:") for word in line.split(":", 1)[1].split()]
    found = []
    for target in phony:
        index = next(i for i, line in enumerate(lines) if re.match(rf"{re.escape(target)}:(?!=)", line))
        start = index
        while start > 0 and lines[start - 1].startswith("#"):
            start -= 1
        found.append((target, lines[start].lstrip("#").strip() if start < index else ""))
    return found


def make_targets_table(repo: Path = REPO) -> str:
    rows = ["| command | what it does |", "| --- | --- |"]
    rows += [f"| `make {target}` | {_cell(text)} |" for target, text in make_targets(repo)]
    return "\n".join(rows)


def generated_list(name: str, page: str) -> str:
    """The table a `<!-- generated: NAME -->` marker on `page` stands for."""
    if name == "commands":
        import typer

        from drape.cli import app

        return commands_table(typer.main.get_command(app), page)
    tables = {"deployments": deployments_table, "configs": configs_table, "make-targets": make_targets_table}
    if name not in tables:
        raise ValueError(f"{page}: unknown marker <!-- generated: {name} -->; known: commands, {', '.join(tables)}")
    return tables[name]()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each `<!-- generated: NAME -->` line with its table (mkdocs calls this once per page)."""
    return MARKER.sub(lambda match: generated_list(match.group(1), page.file.src_uri), markdown)


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site (mkdocs calls this once per build)."""
    import typer
    from mkdocs.structure.files import File

    from drape.cli import app
    from drape.config import PipelineConfig

    config_page, _, _ = config_reference(PipelineConfig)
    cli_page, _, _ = cli_reference(typer.main.get_command(app))
    benchmarks = (Path(__file__).resolve().parents[1] / "benchmarks" / "README.md").read_text()
    pages = (
        (CONFIG_PAGE, config_page),
        (CLI_PAGE, cli_page),
        (BENCHMARKS_PAGE, benchmarks.replace("# benchmarks/", "# Benchmarks", 1)),
    )
    for uri, content in pages:
        files.append(File.generated(config, uri, content=content))
    return files
