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
