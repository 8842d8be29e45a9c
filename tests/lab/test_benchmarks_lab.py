"""The transfer benchmarks at their smoke size, each on the lab it builds (root: namespaces,
tmpfs and bind mounts), so that none rots unseen; the harness's: tests/unit/test_benchmarks.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the benchmarks' labs need root")


def smoke(script: str) -> str:
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_relay_benchmark_runs_at_its_smoke_size():
    out = smoke("relay.py")
    assert "pair 1 (raw first): " in out
    assert "resume moved " in out and " OK (target" in out
    assert "whole-task ratio " in out
    assert out.rstrip().endswith("lab removed")


def test_the_bwlimit_benchmark_runs_at_its_smoke_size():
    out = smoke("bwlimit.py")
    assert "bwlimit  none: stage " in out
    assert "bwlimit   16m: stage " in out and "the pace measured " in out
    assert out.rstrip().endswith("lab removed")


def test_the_scale_benchmark_runs_at_its_smoke_size():
    out = smoke("scale.py")
    assert "lab up with a 32.0 MiB checkpoint" in out
    assert out.rstrip().endswith("lab and directories removed")
