"""The package's layering, read from the source: no import cycles, and orchestration never
imports a view (views receive progress through the reporter protocols instead)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "dflash_ops"


def import_graph() -> dict[str, set[str]]:
    """Module → the dflash_ops modules it imports, counting imports inside functions too."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {other for other in imported if other in modules and other != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> list[str] | None:
        if name in visiting:
            return [*visiting[visiting.index(name) :], name]
        if name in done:
            return None
        visiting.append(name)
        for other in sorted(graph[name]):
            cycle = visit(other)
            if cycle:
                return cycle
        visiting.pop()
        done.add(name)
        return None

    return next((cycle for name in sorted(graph) if (cycle := visit(name))), None)


def test_no_import_cycles():
    assert find_cycle(import_graph()) is None


def test_orchestration_never_imports_a_view():
    graph = import_graph()
    offenders = {
        name: sorted(other for other in imported if other.startswith("dflash_ops.ui"))
        for name, imported in graph.items()
        if not name.startswith("dflash_ops.ui")
    }
    assert {name: views for name, views in offenders.items() if views} == {}


# The packages' ladder, lowest first: a module imports from its own package or lower ones.
LADDER = ("core", "remote", "staging", "provision", "evaluation", "features", "ui")


def _rung(module: str) -> int:
    return LADDER.index(module.split(".")[1])


def test_the_ladder_lists_every_package():
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert packages == set(LADDER)


def test_no_module_imports_from_a_package_above_its_own():
    upward = {
        name: sorted(other for other in imported if _rung(other) > _rung(name))
        for name, imported in import_graph().items()
        if name.count(".") >= 1
    }
    assert {name: others for name, others in upward.items() if others} == {}


ROOT = PACKAGE.parent
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 80


def _sources() -> list[Path]:
    # Every Python file of the project: its tests, scripts and benchmarks are code too.
    packages = ("dflash_ops", "remote", "dflash_lab", "tests", "scripts", "benchmarks")
    roots = [ROOT / name for name in packages]
    return [ROOT / "fabfile.py", *(path for root in roots for path in sorted(root.rglob("*.py")))]


def test_no_module_over_500_lines():
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in _sources()}
    assert {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES} == {}


def test_no_function_over_80_lines():
    lengths = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{path.relative_to(ROOT)}:{node.name}"
                lengths[name] = node.end_lineno - node.lineno + 1
    assert {name: lines for name, lines in lengths.items() if lines > MAX_FUNCTION_LINES} == {}
