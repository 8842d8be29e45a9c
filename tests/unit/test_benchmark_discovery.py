"""The suite finds every benchmark itself (tests/benchmark_smoke.py) and runs it at its smoke
size in one tier, tests/long or tests/lab: checked here, in `make test-fast` and without root
(the lab tier's benchmarks are skipped without), that each takes `--smoke` and says what its
smoke run prints."""

from __future__ import annotations

from tests.benchmark_smoke import SCRIPTS, SMOKE_OUTPUT, imported, scripts


def test_every_benchmark_takes_smoke_and_says_what_its_smoke_run_prints():
    assert "harness.py" in scripts(lab=False) and "relay.py" in scripts(lab=True)
    for script in SCRIPTS:
        assert "benchmarks._smoke" in imported(script), f"benchmarks/{script} takes no --smoke"
        assert script in SMOKE_OUTPUT, (
            f"benchmarks/{script}: say in tests/benchmark_smoke.py's SMOKE_OUTPUT what its "
            "smoke run prints"
        )
    assert sorted(SMOKE_OUTPUT) == SCRIPTS, "SMOKE_OUTPUT names a benchmark that is gone"
