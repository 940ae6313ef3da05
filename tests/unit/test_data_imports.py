"""drape.data imports run one way: formats at the bottom, readers above them, datasets and
importers on top. Read from the source (every import, a function-local one too; a
`TYPE_CHECKING` block is no import at run time), so a cycle fails here before it fails at import."""

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import drape.data

PACKAGE = Path(drape.data.__file__).parent
LAYERS = {  # a module may import its own layer or one below, never one above
    "formats": {"shards", "manifest", "synth", "synth_draw", "portraits"},
    "readers": {"reader", "partition", "cache"},
    "datasets": {"encode", "sources", "importers", "dataset"},
}
RANK = {module: rank for rank, modules in enumerate(LAYERS.values()) for module in modules}


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def runtime_imports(path: Path) -> set[str]:
    """The drape.data modules `path` imports at run time."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("drape.data."):
            found.add(node.module.split(".")[2])
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("drape.data."))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def import_graph() -> dict[str, set[str]]:
    return {path.stem: runtime_imports(path) - {path.stem} for path in PACKAGE.glob("*.py") if path.stem != "__init__"}


def test_every_module_has_a_layer():
    assert set(import_graph()) == set(RANK), "place a new drape.data module in LAYERS"


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as error:
        raise AssertionError(f"drape.data imports in a circle: {error.args[1]}") from None
    assert set(order) == set(graph)


def test_imports_point_down_the_layers():
    upward = [
        f"{module} ({_layer(module)}) imports {target} ({_layer(target)})"
        for module, targets in import_graph().items()
        for target in targets
        if RANK[target] > RANK[module]
    ]
    assert not upward, upward


def test_a_cycle_is_caught(tmp_path):
    """The check itself can fail: two modules that import each other form a cycle."""
    (tmp_path / "a.py").write_text("def f():\n    from drape.data.b import g\n")
    (tmp_path / "b.py").write_text("from drape.data.a import f\nfrom typing import TYPE_CHECKING\n")
    graph = {p.stem: runtime_imports(p) for p in tmp_path.glob("*.py")}
    assert graph == {"a": {"b"}, "b": {"a"}}
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError:
        return
    raise AssertionError("a two-module cycle was not found")


def _layer(module: str) -> str:
    return next(name for name, modules in LAYERS.items() if module in modules)
