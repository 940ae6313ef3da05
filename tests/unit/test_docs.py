"""The documentation site's generated references (docs/hooks.py) cover the code they describe."""

from __future__ import annotations

import importlib.util
import re
import typing
from typing import Literal

import pytest
import typer
from pydantic import BaseModel, Field

from tests.conftest import TESTS

REPO = TESTS.parent
UNDOCUMENTED_FIELDS_AT_MOST = 0  # every config field is described (tests/unit/test_config.py names any that is not)


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


# --- the hand-written pages name only what exists --------------------------------------------------
PAGES = sorted((REPO / "docs").glob("**/*.md")) + [REPO / "README.md"]


def _mentions(pattern: str) -> set[tuple[str, str]]:
    return {(page.relative_to(REPO).as_posix(), m.group(1)) for page in PAGES for m in re.finditer(pattern, page.read_text())}


def test_every_drape_command_the_docs_name_exists(hooks):
    from drape.cli import app

    commands = {" ".join(path[1:]) for path, _ in hooks._commands(typer.main.get_command(app), ["drape"])}
    named = _mentions(r"`drape ([a-z][a-z-]*(?: [a-z][a-z-]*)?)")
    groups = {name.split(" ")[0] for name in commands if " " in name}
    leaves = commands - groups  # after a leaf command, a second word is an argument: `drape tryon SHOPPER`
    unknown = {(page, name) for page, name in named if name not in leaves and name.split(" ")[0] not in leaves}
    assert len(named) > 40 and not unknown, sorted(unknown)


def _resolves(model: type[BaseModel], parts: list[str]) -> bool:
    fields = {field.alias or name: field for name, field in model.model_fields.items()}
    if not parts or parts[0] not in fields:
        return not parts
    annotation, rest = fields[parts[0]].annotation, parts[1:]
    if "dict[" in str(annotation) and rest:
        rest = rest[1:]  # a key: train.stages.<stage>.steps
    nested = [m for m in [annotation, *typing.get_args(annotation)] if isinstance(m, type) and issubclass(m, BaseModel)]
    nested += [
        m for a in typing.get_args(annotation) for m in typing.get_args(a) if isinstance(m, type) and issubclass(m, BaseModel)
    ]
    return not rest or any(_resolves(m, rest) for m in nested)


def test_every_config_field_the_docs_name_exists():
    from drape.config import PipelineConfig

    sections = "|".join(PipelineConfig.model_fields)
    named = _mentions(rf"`((?:{sections})(?:\.[a-z_0-9]+)+)`")
    unknown = {(page, path) for page, path in named if not _resolves(PipelineConfig, path.split("."))}
    unknown = {(page, path) for page, path in unknown if not re.search(r"\.(py|json|md|yaml)$", path)}  # file names
    assert len(named) > 100 and not unknown, sorted(unknown)


def test_every_alert_and_metric_the_docs_name_exists():
    from drape.ops.metrics import REGISTRY

    rules = (REPO / "infra" / "prometheus" / "rules" / "drape.yml").read_text()
    metrics = {name for names in REGISTRY._collector_to_names.values() for name in names}
    alerts = _mentions(r"`(Drape[A-Za-z]+)`")
    assert {"DrapeGateFailed", "DrapeJobsStarved"} <= {name for _, name in alerts}
    assert not {(page, name) for page, name in alerts if f"alert: {name}\n" not in rules}
    series = _mentions(r"\b(drape_[a-z_]*[a-z])\b")
    unknown = {
        (page, n)
        for page, n in series
        if n not in metrics and n not in rules and re.sub(r"_(bucket|sum|count)$", "", n) not in metrics
    }
    assert not unknown, sorted(unknown)


def test_the_runbook_covers_a_failed_gate_a_starving_job_and_a_dead_node():
    runbook = (REPO / "docs" / "runbook.md").read_text()
    sections = re.split(r"^## ", runbook, flags=re.MULTILINE)[1:]
    titles = {section.splitlines()[0]: section for section in sections}
    for title in ("A gate failed", "A job starves in the queue", "A node died"):
        assert title in titles and "**Do**" in titles[title], title


def test_every_docs_image_is_small_and_shown_on_a_page():
    images = sorted((REPO / "docs" / "img").glob("*.png"))
    shown = "".join(page.read_text() for page in PAGES)
    assert len(images) >= 3
    for image in images:
        assert image.stat().st_size < 300_000, f"{image.name}: {image.stat().st_size} bytes; the docs keep images under 300 KB"
        assert f"img/{image.name})" in shown, f"{image.name} is on no page"


# --- the lists of deployments, configs, commands and make targets are generated ---------------------
SOURCES = PAGES + [REPO / "deployments" / "README.md", REPO / "benchmarks" / "README.md", REPO / "infra" / "README.md"]


def test_the_generated_lists_hold_every_deployment_config_command_and_make_target(hooks):
    import yaml

    from drape.cli import app

    declared = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())["deployments"]
    table = hooks.deployments_table()
    assert len(hooks.deployments()) == len(declared) and table.count("\n| `") == len(declared)
    assert "| `staged-training/demo` | `local` |" in table and "| `retention-sweep/weekly` |" in table
    assert "| `retention-sweep/production` | `gpu-k8s` |" in table  # the production configs' weekly sweep
    configs = hooks.configs_table()
    for path in (REPO / "configs").rglob("*.y*ml"):  # folders too: configs/ may hold overlays
        assert f"| `{path.relative_to(REPO).as_posix()}` |" in configs, path
    commands = hooks.commands_table(typer.main.get_command(app), "reference/overview.md")
    assert "[`drape queue submit`](cli.md#drape-queue-submit)" in commands and "| [`drape queue` |" not in commands
    targets = dict(hooks.make_targets())
    assert {"demo", "test", "lint", "services", "rehearse", "docs"} <= set(targets)
    assert all(targets.values()), [target for target, text in targets.items() if not text]  # a comment line above each


def test_the_pages_use_each_generated_list_and_no_unknown_marker(hooks):
    used = {(page, name) for page in PAGES for name in hooks.MARKER.findall(page.read_text())}
    assert {name for _, name in used} == {"deployments", "configs", "commands", "make-targets"}
    for page, name in used:
        assert hooks.generated_list(name, page.relative_to(REPO / "docs").as_posix()).startswith("| ")
    with pytest.raises(ValueError, match="unknown marker"):
        hooks.generated_list("deployment", "index.md")


def _named_in(pattern: str, paths: list) -> set[tuple[str, str]]:
    return {(path.relative_to(REPO).as_posix(), m.group(1)) for path in paths for m in re.finditer(pattern, path.read_text())}


def test_every_deployment_config_and_make_target_the_docs_name_exists(hooks):
    deployments = {item["name"] for item in hooks.deployments()}
    flows = "|".join(sorted(set(hooks.flow_names().values())))
    named = _named_in(rf"\b((?:{flows})/[a-z0-9][a-z0-9-]*)", SOURCES)
    assert len(named) > 10 and not {(page, name) for page, name in named if name not in deployments}
    configs = _named_in(r"(?<![\w./-])((?:tests/)?configs/[\w./-]*?\.ya?ml)\b", SOURCES)
    assert len(configs) > 10 and not {(page, path) for page, path in configs if not (REPO / path).is_file()}
    listed = _named_in(r"(?m)^configs/ +(.*)$", SOURCES)  # a layout block's `configs/   demo.yaml, …` line
    files = {path.name for path in (REPO / "configs").rglob("*.y*ml")}
    unknown = {(page, name) for page, line in listed for name in re.findall(r"[\w.-]+\.ya?ml", line) if name not in files}
    assert not unknown, sorted(unknown)
    targets = {target for target, _ in hooks.make_targets()}
    made = _named_in(r"`make ([a-z][a-z-]*)", SOURCES)
    assert len(made) > 10 and not {(page, name) for page, name in made if name not in targets}


def test_every_section_a_file_names_exists():
    """A Markdown file or README named with a heading in quotes after it, in any tracked text: the heading exists."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    reference = re.compile(r'((?:[\w.-]+/)*[\w.-]+\.md|README)[,:]? ["“]([^"”\n]{2,80})["”]')
    dangling = []
    for name in tracked:
        path = REPO / name
        if path.suffix not in {".md", ".py", ".yaml", ".yml", ".json", ".toml"} and path.name not in {"Makefile", "Dockerfile"}:
            continue
        for match in reference.finditer(path.read_text(errors="replace")):
            file, section = match.groups()
            file = "README.md" if file == "README" else file
            target = next((p for p in (REPO / file, REPO / "docs" / file, path.parent / file) if p.is_file()), None)
            headings = re.findall(r"^#+ +(.*)$", target.read_text(), re.MULTILINE) if target else []
            if not any(section.lower() in heading.lower() for heading in headings):
                dangling.append(f"{name}: {file}, {section!r}")
    assert not dangling, dangling
