"""Every benchmark that builds no lab at its smoke size (tests/benchmark_smoke.py: the suite
finds them; those that build labs: tests/lab/test_benchmarks_lab.py), and the harness
benchmark's children: one that fails or dies fails the benchmark at once, with its error."""

from __future__ import annotations

import math
import os
import time

import pytest

from benchmarks import harness
from tests.benchmark_smoke import run_smoke, scripts

pytestmark = pytest.mark.long(95)  # seconds in a cold `make test` (5 workers)


@pytest.mark.parametrize("script", scripts(lab=False))
def test_each_benchmark_without_a_lab_runs_at_its_smoke_size(script):
    run_smoke(script)


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
