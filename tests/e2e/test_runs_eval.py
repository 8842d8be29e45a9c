"""Two training runs of one step evaluated, watched, swept and compared by run, on the shared
e2e lab (the runs' inventory and staging: tests/lab/test_runs.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest

from dflash_lab import lab as labs
from dflash_ops.core import inventory as inventories
from tests.e2e.conftest import hidden_steps, one_eval_host
from tests.lab.test_runs import QUICK, V5_DIR, add_v5_checkpoints, runs_inventory

pytestmark = pytest.mark.long(45)  # seconds in a cold `make test` (5 workers)


@pytest.fixture
def runs_lab(e2e_lab, tmp_path) -> Iterator[labs.Lab]:
    """The shared lab as a trainer with the steps 2000 and 4000 and one eval host; the second
    run's checkpoints and the runs' inventory are removed afterwards."""
    with hidden_steps(e2e_lab, 6000):
        try:
            yield one_eval_host(e2e_lab, tmp_path)
        finally:
            shutil.rmtree(e2e_lab.container_path(V5_DIR), ignore_errors=True)
            (e2e_lab.root / "runs.yaml").unlink(missing_ok=True)


def test_two_runs_of_one_step_are_evaluated_and_compared_by_run(runs_lab, fab):
    lab = runs_lab
    # v5's steps are other weights than v4's same steps: v4's, swapped.
    add_v5_checkpoints(lab, {2000: lab.checkpoint_path(4000), 4000: lab.checkpoint_path(2000)})
    inventory = runs_inventory(lab, "runs.yaml")
    first = fab(inventory, "run-eval", "--run", "v4", "--step", "4000", *QUICK, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    # v4's result of step 4000 is not v5's: the watch of v5 evaluates both its steps, ...
    watched = fab(inventory, "watch", "--run", "v5", "--once", *QUICK, timeout=600)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert "pass 1: evaluated 2000, 4000" in " ".join(watched.stdout.split())
    assert "watch-state@v5.json" in " ".join(watched.stdout.split())
    # ... and v5's result of step 2000 is not v4's: v4's new steps are 2000 alone.
    sweep = fab(inventory, "run-eval", "--run", "v4", "--all-new", *QUICK, timeout=600)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert "sweep: steps 2000 over eval" in sweep.stdout
    pulled: dict[tuple, dict] = {}
    for path in inventories.load(inventory).local.results.glob("*/results.json"):
        checkpoint = json.loads(path.read_text())["checkpoint"]
        pulled[checkpoint["training_run"], checkpoint["step"]] = checkpoint
        run_id = path.parent.name  # the training run is in the id: `…-v4-step4000-eval-…`
        assert f"-{checkpoint['training_run']}-step{checkpoint['step']}-" in run_id
    assert sorted(pulled) == [("v4", 2000), ("v4", 4000), ("v5", 2000), ("v5", 4000)]
    assert pulled["v4", 4000]["sha256"] != pulled["v5", 4000]["sha256"]
    assert "/checkpoints/v5/step_4000/" in pulled["v5", 4000]["path"]

    compared = fab(inventory, "compare", "--format", "json", "--report")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    rows = json.loads(compared.stdout)["runs"]
    assert [(row["training_run"], row["step"]) for row in rows] == [
        ("v4", 2000), ("v4", 4000), ("v5", 2000), ("v5", 4000),
    ]  # fmt: skip
    page = (inventories.load(inventory).local.results / "report.html").read_text()
    assert "(v4 step 4000)" in page and "(v5 step 4000)" in page
    only = fab(inventory, "compare", "--run", "v5")
    assert only.returncode == 0, only.stderr
    assert " v5 " in only.stdout and " v4 " not in only.stdout
    unknown = fab(inventory, "compare", "--run", "v6")
    assert unknown.returncode == 1 and "its runs: v4, v5" in unknown.stderr
