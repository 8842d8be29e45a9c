"""benchmarks/target_scale.py's fit of the estimate's constants (its smoke run, a random hybrid
target planned and run by the harness's own command line, each estimated phase set against its
measured time: tests/long/test_benchmarks.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

# The calibration runs docs/estimate.md reports, quiet and loaded, single runs; the worst
# CPU-bound phase it states for them together. And the median-of-3 runs it checks the
# constants on, each within the issue's ±35 %.
CHECKED = {"estimate-median-quiet.json": 24, "estimate-median-loaded.json": 18}
SAVED = [
    "estimate-quiet-1.json",
    "estimate-quiet-2.json",
    "estimate-loaded.json",
    "estimate-measured.json",
    "estimate-checked.json",
]
STATED_WORST = 43


def test_the_estimate_s_constants_hold_for_the_saved_calibration_runs():
    """The constants in dflash_eval.plan.estimate against every run docs/estimate.md reports:
    a change of a constant that breaks what it states fails here."""
    files = [f"docs/{saved}" for saved in SAVED]
    command = [sys.executable, "benchmarks/target_scale.py", "--fit", *files]
    output = subprocess.check_output(command, cwd=REPO, text=True, timeout=120)
    current = re.match(r"with the current constants, worst phase: (\d+) %\n", output)
    assert current, output
    assert int(current[1]) <= STATED_WORST, output
    assert (
        f"within ±{STATED_WORST} % for every single run" in (REPO / "docs/estimate.md").read_text()
    )
    assert re.search(
        r"^reading the weights \(disk-bound, not in the worst phase\): \d+ %$", output, re.M
    )


@pytest.mark.parametrize("saved", sorted(CHECKED))
def test_the_estimate_holds_within_35_percent_on_the_median_runs_the_fit_never_saw(saved):
    command = [sys.executable, "benchmarks/target_scale.py", "--fit", f"docs/{saved}"]
    output = subprocess.check_output(command, cwd=REPO, text=True, timeout=120)
    current = re.match(r"with the current constants, worst phase: (\d+) %\n", output)
    assert current and int(current[1]) <= 35, output
    assert f"**{CHECKED[saved]} %**" in (REPO / "docs/estimate.md").read_text()
