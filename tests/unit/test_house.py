"""House rules the layout depends on: small modules and functions, imports that run one way
(`flows → tasks → drape`, `tasks → scheduler → drape`; only drape/cli may reach the flows and the queue),
the scheduler's rooms, each reaching only the rooms below it, and drape/training's rooms, each reaching only
the rooms before it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("drape", "scheduler", "tasks", "flows")
SOURCES = sorted(path for package in PACKAGES for path in (REPO / package).rglob("*.py"))
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_modules_and_functions_stay_small(path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name}: split it by what its parts do"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_imports_run_one_way():
    allowed = {
        "drape": {"drape"},
        "scheduler": {"drape", "scheduler"},
        "tasks": {"drape", "scheduler", "tasks"},
        "flows": {"drape", "tasks", "flows"},
    }
    ours = set(PACKAGES)
    for path in SOURCES:
        package = path.relative_to(REPO).parts[0]
        reached = _imports(path) & ours
        if path.is_relative_to(REPO / "drape" / "cli"):  # the composition root: flows and the queue, inside commands
            assert "tasks" not in reached, path
            continue
        assert reached <= allowed[package], f"{path.relative_to(REPO)} imports {sorted(reached - allowed[package])}"
        if package == "drape":
            assert "prefect" not in _imports(path), f"{path.relative_to(REPO)} imports prefect (drape runs under torchrun too)"


# scheduler/'s rooms (scheduler/__init__.py) and the rooms each may import; a room not listed imports none
ROOMS = {
    "policy": set(),
    "queue": {"policy"},
    "engines": {"policy", "queue"},
    "dispatch": {"policy", "queue", "engines"},
    "jobs": {"policy", "queue", "engines", "dispatch"},
    "sim": {"policy", "queue"},
}
# pure decisions: no database, clock, process, network or model; only these modules
POLICY_MAY_IMPORT = {
    "__future__",
    "bisect",
    "collections",
    "dataclasses",
    "heapq",
    "itertools",
    "math",
    "sortedcontainers",
    "typing",
}


def _modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_the_scheduler_is_in_rooms_each_reaching_only_the_rooms_below():
    scheduler = REPO / "scheduler"
    rooms = {path.name for path in scheduler.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert rooms == set(ROOMS), f"scheduler/ holds rooms {sorted(rooms)}; the house lists {sorted(ROOMS)}"
    assert sorted(path.name for path in scheduler.glob("*.py")) == ["__init__.py"], "scheduler/ itself holds only rooms"
    package = ast.parse((scheduler / "__init__.py").read_text())
    assert all(isinstance(node, ast.Expr) for node in package.body), "scheduler/__init__.py is the map, no code"
    for room, below in ROOMS.items():
        for path in (scheduler / room).rglob("*.py"):
            reached = {name.split(".")[1] for name in _modules(path) if name.startswith("scheduler.")}
            assert reached <= below | {room}, f"{path.relative_to(REPO)} reaches room(s) {sorted(reached - below - {room})}"
            if room == "policy":
                outside = {name.split(".")[0] for name in _modules(path)} - POLICY_MAY_IMPORT - {"scheduler"}
                assert not outside, f"{path.relative_to(REPO)} imports {sorted(outside)}: policy/ is pure decisions"


# drape/training's rooms in order (drape/training/__init__.py): each imports only the rooms before it
TRAINING_ROOMS = ("published", "recipes", "checkpoints", "loop", "jobs")


def test_training_is_in_rooms_each_reaching_only_the_rooms_before_it():
    training = REPO / "drape" / "training"
    rooms = {path.name for path in training.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert rooms == set(TRAINING_ROOMS), f"drape/training holds rooms {sorted(rooms)}; the house lists {TRAINING_ROOMS}"
    assert sorted(path.name for path in training.glob("*.py")) == ["__init__.py"], "drape/training itself holds only rooms"
    for index, room in enumerate(TRAINING_ROOMS):
        allowed = set(TRAINING_ROOMS[: index + 1])
        for path in (training / room).rglob("*.py"):
            reached = {name.split(".")[2] for name in _modules(path) if name.startswith("drape.training.")}
            assert "drape.training" not in _modules(path), f"{path.relative_to(REPO)}: import from a room, not drape.training"
            assert reached <= allowed, f"{path.relative_to(REPO)} reaches room(s) {sorted(reached - allowed)} after {room}/"


def test_the_suite_starts_its_longest_modules_first():
    """`make test` gives xdist whole modules in collection order (tests/conftest.py's LONGEST_FIRST):
    every module named there exists, and the Makefile turns off xdist's own reordering by test
    count, which started the one-test rehearsal last."""
    from tests.conftest import LONGEST_FIRST, TESTS

    assert [name for name in LONGEST_FIRST if not (TESTS / name).is_file()] == []
    recipe = next(line for line in (REPO / "Makefile").read_text().splitlines() if "-m pytest -q $(if" in line)
    assert "--dist loadfile" in recipe and "--no-loadscope-reorder" in recipe, recipe


def test_no_package_holds_more_modules_than_a_reader_can_see_at_once():
    """A package of more than 15 modules side by side is grouped into rooms (scheduler/, drape/training,
    drape/gates, drape/config/reading show how)."""
    crowded = {}
    for folder in sorted({path.parent for path in SOURCES}):
        modules = list(folder.glob("*.py"))
        if len(modules) > 15:
            crowded[str(folder.relative_to(REPO))] = len(modules)
    assert not crowded, f"packages with more than 15 modules side by side: {crowded}"
