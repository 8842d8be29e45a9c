"""benchmarks/target_scale.py at its smoke size: a random hybrid target planned and run by
the harness's own command line, each estimated phase set against its measured time."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_the_target_scale_benchmark_runs_at_its_smoke_size():
    command = [sys.executable, "benchmarks/target_scale.py", "--smoke"]
    try:
        output = subprocess.check_output(command, cwd=REPO, text=True, timeout=900)
    except subprocess.CalledProcessError as failed:
        pytest.fail(f"{failed}: {failed.output}")
    lines = output.splitlines()
    assert lines[0].startswith("before: ") and "load average" in lines[0]
    assert re.search(r"^smoke: 0 M parameters \(target in float32\), threads 1,", output, re.M)
    for phase in ("load_target", "completions", "hidden_states", "drafter"):
        assert re.search(rf"^ +{phase}: measured +\d+\.\d\d s wall, .* estimated ", output, re.M)
    assert re.fullmatch(r"estimate vs measured, worst phase: \d+ %", lines[-1])


@pytest.mark.parametrize("saved", ["estimate-measured.json", "estimate-checked.json"])
def test_the_estimate_s_constants_hold_for_the_saved_calibration_runs(saved):
    """The constants in dflash_eval.plan.estimate against the runs docs/estimate.md reports (the
    fit's and the check's): a change of a constant that breaks the ±35 % promise fails here."""
    command = [sys.executable, "benchmarks/target_scale.py", "--fit", f"docs/{saved}"]
    output = subprocess.check_output(command, cwd=REPO, text=True, timeout=120)
    current = re.match(r"with the current constants, worst phase: (\d+) %", output)
    assert current, output
    assert int(current[1]) <= 35, output
