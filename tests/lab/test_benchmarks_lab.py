"""Every benchmark that builds a lab (root: namespaces, tmpfs and bind mounts) at its smoke
size, each on the lab it builds, so that none rots unseen (tests/benchmark_smoke.py: the suite
finds them; the others: tests/long/test_benchmarks.py)."""

from __future__ import annotations

import os

import pytest

from tests.benchmark_smoke import run_smoke, scripts

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the benchmarks' labs need root")


@pytest.mark.parametrize("script", scripts(lab=True))
def test_each_benchmark_that_builds_a_lab_runs_at_its_smoke_size(script):
    run_smoke(script)
