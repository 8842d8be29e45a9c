"""The suite finds every benchmark itself (tests/benchmark_smoke.py) and runs it at its smoke
size in one tier, tests/long or tests/lab: checked here, in `make test-fast` and without root
(the lab tier's benchmarks are skipped without), that each takes `--smoke` and says what its
smoke run prints."""

from __future__ import annotations

import ast

from tests.benchmark_smoke import BENCHMARKS, SCRIPTS, SMOKE_OUTPUT, scripts


def test_every_benchmark_takes_smoke_and_says_what_its_smoke_run_prints():
    assert "harness.py" in scripts(lab=False) and "relay.py" in scripts(lab=True)
    for script in SCRIPTS:
        imported = {
            node.module
            for node in ast.walk(ast.parse((BENCHMARKS / script).read_text()))
            if isinstance(node, ast.ImportFrom)
        }
        assert "benchmarks._smoke" in imported, f"benchmarks/{script} takes no --smoke"
    assert sorted(SMOKE_OUTPUT) == SCRIPTS
