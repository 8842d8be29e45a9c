"""Every benchmark at its `--smoke` size (benchmarks/_smoke.py), found by the suite itself: each
`benchmarks/*.py` (the `_*.py` are their shared parts) runs in exactly one tier, those that
build sshd labs (root: network namespaces, tmpfs) in tests/lab/test_benchmarks_lab.py, the
others in tests/long/test_benchmarks.py, and what its smoke run must print is in SMOKE_OUTPUT.
A new benchmark runs unasked, and fails until it says there what its output shows."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Callable

from benchmarks import diagnose_faults, harness
from tests.conftest import REPO

BENCHMARKS = REPO / "benchmarks"
SCRIPTS = sorted(path.name for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_"))
# What builds an sshd lab: dflash_lab.lab itself, or the transfer benchmarks' lab on top of it.
LAB_MODULES = {"dflash_lab.lab", "benchmarks._lab"}


def imported(script: str) -> set[str]:
    """Every module the benchmark imports, `from A import B` counted as A and A.B."""
    names: set[str] = set()
    for node in ast.walk(ast.parse((BENCHMARKS / script).read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def builds_labs(script: str) -> bool:
    """Whether the benchmark imports what builds an sshd lab."""
    return bool(imported(script) & LAB_MODULES)


def scripts(lab: bool) -> list[str]:
    """The benchmarks one tier runs: those that build labs, or the others."""
    return [script for script in SCRIPTS if builds_labs(script) == lab]


def run_smoke(script: str) -> None:
    """Run `benchmarks/SCRIPT --smoke` and check what it printed against SMOKE_OUTPUT (one
    missing from it fails here at once, and in tests/unit/test_benchmark_discovery.py)."""
    shows = SMOKE_OUTPUT[script]
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    shows(done.stdout)


def _shows(out: str, *patterns: str) -> None:
    for pattern in patterns:
        assert re.search(pattern, out, re.MULTILINE), f"no line matches {pattern!r} in:\n{out}"


def _harness(out: str) -> None:
    _shows(out, *(re.escape(f"{variant}: ") for variant in harness.VARIANTS))
    _shows(out, "batched vs uncached: ", "compute floor: ")
    assert out.count("metrics identical: True") == len(harness.BASELINES), out


def _target_scale(out: str) -> None:
    lines = out.splitlines()
    assert lines[0].startswith("before: ") and "load average" in lines[0], out
    _shows(out, r"^smoke: 0 M parameters \(target in float32\), threads 1,")
    for phase in ("load_target", "completions", "hidden_states", "drafter"):
        _shows(out, rf"^ +{phase}: measured +\d+\.\d\d s wall, .* estimated ")
    disk = r"reading the weights \(disk-bound, not in the worst phase\): (\d+ %|none counted)"
    assert re.fullmatch(disk, lines[-2]), out
    assert re.fullmatch(r"estimate vs measured, worst phase: \d+ %", lines[-1]), out


def _feature_verify(out: str) -> None:
    _shows(out, r": 2 hidden-state entries, 2\.1 MB$")
    _shows(out, r"^  plain +\d+\.\d{3} s +\d+ MB/s$", r"^  verified +\d+\.\d{3} s +\d+ MB/s$")
    _shows(out, r"^  verification adds -?\d+\.\d{3} s here, -?\d+\.\d\d s per GB$")
    _shows(out, r"^  \(sha256 alone on this machine: \d+ MB/s\)$")


def _diagnose_faults(out: str) -> None:
    _shows(out, r"^3 prompts, 24 tokens each; one torch thread$")
    for fault in diagnose_faults.SMOKE_FAULTS.split(","):
        _shows(out, rf"^{re.escape(fault)} +rank .* gap closed by the top repair: .* top: \[")


def _relay(out: str) -> None:
    _shows(out, re.escape("pair 1 (raw first): "), "resume moved ", re.escape(" OK (target"))
    _shows(out, "whole-task ratio ")
    assert out.rstrip().endswith("lab removed"), out


def _bwlimit(out: str) -> None:
    _shows(out, "bwlimit  none: stage ", "bwlimit   16m: stage ", "the pace measured ")
    assert out.rstrip().endswith("lab removed"), out


def _scale(out: str) -> None:
    _shows(out, re.escape("lab up with a 32.0 MiB checkpoint"))
    assert out.rstrip().endswith("lab and directories removed"), out


SMOKE_OUTPUT: dict[str, Callable[[str], None]] = {
    "harness.py": _harness,
    "target_scale.py": _target_scale,
    "feature_verify.py": _feature_verify,
    "diagnose_faults.py": _diagnose_faults,
    "relay.py": _relay,
    "bwlimit.py": _bwlimit,
    "scale.py": _scale,
}
