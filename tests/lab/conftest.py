"""The lab tier: real sshd hosts (the session `lab`, or `make_lab` for a test that changes
one), random-byte or trained checkpoints, and no venvs: a test that sets up an eval host
belongs in tests/e2e, and fails here saying so. For the detached-run tests: a stand-in harness
(`fake`) and the eval host they run it on (`eval_host`), left with no run after each test."""

from __future__ import annotations

import shlex

import pytest

from dflash_ops.core.inventory import load
from dflash_ops.evaluation import jobs
from dflash_ops.provision import setup
from dflash_ops.remote.connection import Host


@pytest.fixture(autouse=True)
def _no_venvs(monkeypatch):
    """Every way of setting up an eval host (the fab task, `setup_eval_hosts`, however it was
    imported) creates its venv through this one name."""

    def refuse(*args, **kwargs):
        pytest.fail("a lab-tier test sets up no eval host (a venv): it belongs in tests/e2e")

    monkeypatch.setattr(setup, "create_venv", refuse)


# --- detached runs on the lab's eval host (test_jobs.py, test_run_status.py) ----------------

# A stand-in for the harness: JSON events on stdout, text on stderr, a results file (run-eval's
# own tests run the real harness). A run that a test needs "still running" is *gated*: it
# blocks on a FIFO in its run directory until the test opens the gate (or stops the run).
FAKE_HARNESS = """
import json, os, sys
steps, outcome, gated = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "gated"
if gated:
    os.mkfifo("gate")  # before the first event: whoever saw an event can open the gate
for i in range(steps):
    print(json.dumps({"event": "progress", "phase": "drafter", "done": i + 1, "total": steps}),
          flush=True)
    print(f"working {i}", file=sys.stderr, flush=True)
if gated:
    open("gate").read()  # blocks until the test writes to the gate and closes it
if outcome == "fail":
    print("boom: the drafter exploded", file=sys.stderr)
    sys.exit(3)
open("results.json", "w").write(json.dumps({"ok": True}))
"""


def fake(steps: int, outcome: str = "ok", gated: bool = False) -> str:
    gate = "gated" if gated else "free"
    return f"python3 -c {shlex.quote(FAKE_HARNESS)} {steps} {outcome} {gate}"


@pytest.fixture
def eval_host(lab):
    inv = load(lab.inventory_path)
    host, entry = Host(inv, "eval"), inv.eval_hosts["eval"]
    yield host, entry
    for run in jobs.list_runs(host, entry):  # a gated run left by a failed test: stop it
        if not run.done:
            jobs.cancel(host, entry, run)
            jobs.wait_finished(host, entry, run.run_id)
    host.run(f"rm -rf {shlex.quote(jobs.runs_dir(entry))}")
    host.close()
