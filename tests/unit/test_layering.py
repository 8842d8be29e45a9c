"""The layering of both sides, read from the source: no import cycles (type-only imports
count), each package on its ladder, orchestration never imports a view (views receive
progress through the reporter protocols instead), and the workstation reaches the harness
only through its stdlib-only `contract`, so that it never loads torch."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dflash_ops"
HARNESS = PACKAGE.parent / "remote" / "dflash_eval"


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module → the modules of `package` it imports, counting imports inside functions and
    under `if TYPE_CHECKING:` too."""
    modules = {}
    for path in package.rglob("*.py"):
        name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
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


@pytest.mark.parametrize("package", [PACKAGE, HARNESS], ids=["workstation", "harness"])
def test_no_import_cycles(package):
    assert find_cycle(import_graph(package)) is None


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


# The harness's ladder, lowest first. Its top is the package's own modules (the command line
# and `python -m dflash_eval`), which hand each command to the package that runs it.
HARNESS_LADDER = ("contract", "target", "drafter", "walk", "reference", "run", "plan", "diagnose")


def _harness_rung(module: str) -> int:
    parts = module.split(".")
    package = parts[1] if len(parts) > 1 else ""
    return HARNESS_LADDER.index(package) if package in HARNESS_LADDER else len(HARNESS_LADDER)


def test_the_harness_ladder_lists_every_package():
    packages = {path.name for path in HARNESS.iterdir() if (path / "__init__.py").exists()}
    assert packages == set(HARNESS_LADDER)


def test_the_harness_root_holds_only_its_entry_points():
    # Everything else belongs to a package, and so to a rung.
    assert {path.name for path in HARNESS.glob("*.py")} == {"__init__.py", "__main__.py", "cli.py"}


def test_no_harness_module_imports_from_a_package_above_its_own():
    upward = {
        name: sorted(other for other in imported if _harness_rung(other) > _harness_rung(name))
        for name, imported in import_graph(HARNESS).items()
    }
    assert {name: others for name, others in upward.items() if others} == {}


def test_the_build_ships_every_harness_package():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((HARNESS.parents[1] / "pyproject.toml").read_text())
    listed = set(project["tool"]["setuptools"]["packages"])
    assert {"dflash_eval", *(f"dflash_eval.{name}" for name in HARNESS_LADDER)} <= listed


def test_the_harness_hash_covers_every_package_and_no_bytecode():
    # The hash a run records (the harness's own directory) is the one it is deployed under.
    from dflash_eval.contract.version import harness_files, harness_hash

    assert harness_hash() == harness_hash(HARNESS)
    packages = {f"{name}/__init__.py" for name in HARNESS_LADDER}
    assert {"cli.py", "contract/version.py", *packages} <= set(harness_files())
    assert [name for name in harness_files() if "__pycache__" in name] == []


def _imported_names(path: Path) -> set[str]:
    """Every module an `import` or `from … import` in the file names, anywhere in it."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "dflash_eval":
            names |= {f"dflash_eval.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_contract_imports_only_the_standard_library_and_itself():
    outside = {
        str(path.relative_to(HARNESS)): sorted(
            name
            for name in _imported_names(path)
            if name.split(".")[0] not in sys.stdlib_module_names
            and not name.startswith("dflash_eval.contract")
        )
        for path in (HARNESS / "contract").rglob("*.py")
    }
    assert {name: others for name, others in outside.items() if others} == {}


ROOT = PACKAGE.parent
WORKSTATION = [ROOT / "fabfile.py", *sorted(PACKAGE.rglob("*.py"))]


def test_the_workstation_imports_only_the_harness_contract():
    reaching = {
        str(path.relative_to(ROOT)): sorted(
            name
            for name in _imported_names(path)
            if name.split(".")[0] == "dflash_eval" and not name.startswith("dflash_eval.contract")
        )
        for path in WORKSTATION
    }
    assert {name: others for name, others in reaching.items() if others} == {}


def test_importing_the_workstation_loads_neither_torch_nor_transformers():
    # A fresh interpreter: every dflash_ops module, then the fab tasks' module.
    probe = (
        "import importlib, json, pkgutil, sys; import dflash_ops; "
        "[importlib.import_module(m.name) for m in "
        "pkgutil.walk_packages(dflash_ops.__path__, 'dflash_ops.')]; import fabfile; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = json.loads(done.stdout)
    assert "fabfile" in loaded and "dflash_ops.ui.cli" in loaded
    assert [name for name in loaded if name.split(".")[0] in ("torch", "transformers")] == []


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
