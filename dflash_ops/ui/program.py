"""`dflash-ops`: every `fab` task, from any directory.

Inside the checkout, `fab TASK` finds fabfile.py by looking in the current directory and its
parents. `dflash-ops TASK` (a console script that `make setup` installs, editable) loads that
same fabfile.py from the checkout this package is installed from and hands it to Fabric's
program API as a bundled namespace (Invoke's "reusing as a binary"): the same tasks, flags,
help and exit statuses, from anywhere, and `dflash-ops --version`.

The inventory is found as `fab` finds it: `--inventory PATH`, else `$DFLASH_INVENTORY`, else
`inventory.yaml` in the current directory. Never the checkout's own `inventory.yaml` from
elsewhere: which servers a command reaches must not depend on where the package lives.

`dflash-ops results …` are the commands that read pulled results without an inventory
(dflash_ops.ui.cli). The lab's tasks are a program of their own (`dflash-lab`,
dflash_lab.tasks), so that neither `fab --list` nor `dflash-ops --list` shows them.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType

from fabric import Config, Executor
from fabric.main import Fab
from invoke import Collection

CHECKOUT = Path(__file__).resolve().parents[2]
FABFILE = CHECKOUT / "fabfile.py"


def make_program(name: str, namespace: Collection) -> Fab:
    """A Fabric program named `name` that runs the tasks of `namespace`."""
    return Fab(
        name=name,
        binary=name,
        version=package_version(),
        namespace=namespace,
        executor_class=Executor,
        config_class=Config,
    )


def package_version() -> str:
    try:
        return version("dflash-ops")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def user_tasks() -> Collection:
    """The tasks of the checkout's fabfile.py, as `fab --list` shows them there."""
    return Collection.from_module(_fabfile(), loaded_from=str(CHECKOUT))


def _fabfile() -> ModuleType:
    loaded = sys.modules.get("fabfile")
    if loaded is not None and Path(loaded.__file__ or "").resolve() == FABFILE:
        return loaded
    if not FABFILE.is_file():
        raise SystemExit(
            f"dflash-ops: {FABFILE}: not found; dflash-ops runs the tasks of the checkout it "
            "is installed from: install it with `make setup` (pip install -e CHECKOUT)"
        )
    spec = importlib.util.spec_from_file_location("fabfile", FABFILE)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["fabfile"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def main(argv: list[str] | None = None) -> None:
    """The `dflash-ops` console script."""
    argv = list(sys.argv if argv is None else argv)
    if argv[1:2] == ["results"]:
        from dflash_ops.ui.cli import main as results_cli

        results_cli(argv[1:], prog_name="dflash-ops")
        return
    make_program("dflash-ops", user_tasks()).run(argv)
