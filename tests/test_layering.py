"""The package's layering, read from the source: no import cycles, and orchestration never
imports a view (views receive progress through the reporter protocols instead)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "dflash_ops"


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
