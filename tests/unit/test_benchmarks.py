"""benchmarks/harness.py at its smoke size (the lab benchmarks: tests/lab/test_benchmarks_lab.py),
and its children: one that fails or dies fails the benchmark at once, with its error."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest

from benchmarks import harness
from tests.conftest import REPO


def test_the_harness_benchmark_runs_at_its_smoke_size():
    done = subprocess.run(
        [sys.executable, "benchmarks/harness.py", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for variant in harness.VARIANTS:
        assert f"{variant}: " in done.stdout
    assert "batched vs uncached: " in done.stdout
    assert done.stdout.count("metrics identical: True") == len(harness.BASELINES)
    assert "compute floor: " in done.stdout


def test_a_child_s_error_fails_the_benchmark_with_its_traceback():
    process, results = harness._start(math.sqrt, -1.0)  # called as sqrt(-1.0, results)
    with pytest.raises(SystemExit, match=r"(?s)in sqrt's process:.*TypeError"):
        harness._receive("sqrt", process, results)
    process.join()


def test_a_child_that_dies_without_a_word_fails_the_benchmark_at_once():
    context = harness._CONTEXT
    process, results = context.Process(target=os._exit, args=(3,)), context.Queue()
    process.start()
    started = time.monotonic()
    with pytest.raises(SystemExit, match=r"ended \(exit code 3\) without answering"):
        harness._receive("gone", process, results)
    assert time.monotonic() - started < 30  # not a wait on a pipe nobody writes to
