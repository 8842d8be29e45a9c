"""`dflash-ops` runs every fab task from any directory (dflash_ops.ui.program), `--version`
says what runs, and the lab's tasks are `dflash-lab`'s alone: neither `fab --list` nor
`dflash-ops --list` shows them."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.conftest import FAB, REPO, run_fab, run_in_process, run_lab
from tests.unit.test_report import pull

DFLASH_OPS = FAB.parent / "dflash-ops"


def _outside(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`dflash-ops ARGS` started in a directory outside the checkout, with no inventory set."""
    env = {key: value for key, value in os.environ.items() if key != "DFLASH_INVENTORY"}
    env["PYTHONPATH"] = f"{REPO / 'remote'}:{REPO}"  # this checkout, whatever the venv holds
    return subprocess.run(
        [str(DFLASH_OPS), *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )


def _listed(output: str) -> list[str]:
    return re.findall(r"^  ([a-z][a-z0-9-]*)\s", output, flags=re.MULTILINE)


def test_run_eval_help_works_from_a_directory_outside_the_checkout(tmp_path):
    shown = _outside(tmp_path, "run-eval", "--help")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("Usage: dflash-ops [--core-opts] run-eval [--options]")
    assert "--max-new-tokens=INT" in shown.stdout and "--inventory=STRING" in shown.stdout


def test_from_elsewhere_the_inventory_is_the_current_directorys_never_the_checkouts(tmp_path):
    missing = _outside(tmp_path, "check-hosts")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.strip() == (
        "error: inventory.yaml: inventory not found. Pass --inventory PATH, set "
        "$DFLASH_INVENTORY, or copy the example inventory.yaml and edit it."
    )


def test_dflash_ops_lists_the_tasks_fab_lists_and_neither_lists_the_labs():
    from dflash_ops.ui.program import main

    ours = run_in_process(main, None, "dflash-ops", "--list")
    theirs = run_fab(None, "--list")
    assert ours.returncode == theirs.returncode == 0, ours.stderr + theirs.stderr
    tasks = _listed(ours.stdout)
    assert tasks == _listed(theirs.stdout)
    assert {"run-eval", "check-hosts", "compare", "setup-eval-host"} <= set(tasks)
    assert [task for task in tasks if "lab" in task] == []
    lab = run_lab("--list")
    assert _listed(lab.stdout) == ["down", "status", "up"]


def test_version_names_the_package_and_what_it_runs_on():
    from dflash_ops.ui.program import main

    shown = run_in_process(main, None, "dflash-ops", "--version")
    assert shown.returncode == 0
    lines = shown.stdout.splitlines()
    assert re.fullmatch(r"dflash-ops \d+\.\d+\.\d+", lines[0]), lines
    assert lines[1].startswith("Paramiko ") and lines[2].startswith("Invoke ")


def test_the_results_commands_stay_under_dflash_ops_results(tmp_path):
    from dflash_ops.ui.program import main

    pull(tmp_path / "results", 2000, 2.0)
    listed = run_in_process(
        main, None, "dflash-ops", "results", "list", "--results", str(tmp_path / "results")
    )
    assert listed.returncode == 0, listed.stderr
    assert "step 2000  succeeded" in listed.stdout
