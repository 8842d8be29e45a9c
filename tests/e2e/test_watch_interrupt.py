"""Ctrl-C on `fab watch`, on the e2e lab: wherever it lands (polling, staging, launching,
streaming, pulling, sleeping between passes) the watch stops with its summary (130), starts
no further run, and names the run it leaves going on its host."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from dflash_lab import lab as labs
from dflash_ops.core.inventory import load
from dflash_ops.evaluation import jobs
from dflash_ops.evaluation.watch import WatchState
from dflash_ops.remote.connection import Host
from dflash_ops.ui.console import console
from dflash_ops.ui.watch_view import WatchView, _show_stopped
from tests.conftest import start_fab
from tests.e2e.conftest import one_eval_host, pulled_steps, runs_on_hosts

pytestmark = pytest.mark.long(85)  # seconds in a cold `make test` (5 workers)

QUICK = ["--num-prompts", "2", "--max-new-tokens", "24", "--ddtree", "4,8"]


def wait_for_state(lab: labs.Lab, state: str, count: int = 1) -> list[jobs.Run]:
    """Poll the eval hosts (bounded) until `count` runs are in `state`."""
    for _ in range(240):
        runs = [run for run in runs_on_hosts(lab) if run.state == state]
        if len(runs) >= count:
            return runs
        time.sleep(0.5)
    raise AssertionError(f"no {state} run on the lab's eval hosts")


def watch_until(lab: labs.Lab, marker: str) -> tuple[subprocess.Popen, list[str]]:
    """`fab watch --interval 10m` started, its output read up to the first line with `marker`
    (the watch is killed if none comes within two minutes)."""
    watching = start_fab(lab.inventory_path, "watch", "--interval", "10m", *QUICK)
    guard = threading.Timer(120, watching.kill)
    guard.start()
    seen = []
    for line in watching.stdout:
        seen.append(line)
        if marker in line:
            break
    guard.cancel()
    assert marker in "".join(seen), "".join(seen) + watching.stderr.read()
    return watching, seen


def interrupt(watching: subprocess.Popen, seen: list[str]) -> str:
    """Ctrl-C as a terminal sends it (to the watch and its children); its whole output."""
    os.killpg(watching.pid, signal.SIGINT)
    rest, errors = watching.communicate(timeout=60)
    return "".join(seen) + rest + errors


def run_dirs(lab: labs.Lab) -> set[str]:
    """The run directories on the eval hosts of the lab's inventory, read from their disks."""
    entries = load(lab.inventory_path).eval_hosts.values()
    return {run.name for entry in entries for run in Path(jobs.runs_dir(entry)).glob("[!.]*")}


def test_ctrl_c_stops_and_the_started_run_goes_on(e2e_lab, trainer):
    trainer.only(2000)
    # Interrupt once the watch itself says the run started (the host may show it running
    # while the launch is still confirming it): that is the case this test is about.
    watching, seen = watch_until(e2e_lab, " started (")
    [run] = wait_for_state(e2e_lab, "running")
    stdout = interrupt(watching, seen)
    assert watching.returncode == 130
    flat = " ".join(stdout.split())
    assert "watch stopped" in flat
    assert f"run {run.run_id} goes on on {run.host}" in flat
    assert f"fab eval-logs --id {run.run_id} --follow" in stdout.replace("\n", "")
    wait_for_state(e2e_lab, "succeeded")

    # Restarted, it pulls that run and starts nothing; then Ctrl-C ends its wait at once.
    watching, seen = watch_until(e2e_lab, "next look in 10 min")
    output = interrupt(watching, seen)
    assert watching.returncode == 130, output
    assert f"pulled {run.run_id} (succeeded)" in output
    assert "pass 1: nothing new" in output
    assert [r.run_id for r in runs_on_hosts(e2e_lab)] == [run.run_id]
    assert pulled_steps(e2e_lab) == [2000]


def test_ctrl_c_during_a_launch_names_the_run_if_the_host_started_it(e2e_lab):
    """A Ctrl-C can land between the launch and its confirmation: the watch then asks the
    host, and names the run only if it holds the host (or is about to)."""
    inventory = load(e2e_lab.inventory_path)
    name, entry = next(iter(inventory.eval_hosts.items()))
    states = {"started-run": "touch pid", "waiting-run": ":", "refused-run": "touch refused"}
    host = Host(inventory, name)
    try:
        for run_id, make in states.items():
            host.run(f"mkdir -p {shlex.quote(jobs.run_dir(entry, run_id))} && cd $_ && {make}")
        view = WatchView()
        for run_id in (*states, "absent-run"):
            view.host(name).starting(run_id)
        view.host(name).follow("followed-run")
        with console.capture() as captured:
            _show_stopped(view, inventory)
        shown = " ".join(captured.get().split())
        for run_id in ("started-run", "waiting-run", "followed-run"):
            assert f"run {run_id} goes on on {name}" in shown
        assert "refused-run" not in shown and "absent-run" not in shown
    finally:
        for run_id in states:
            host.run(f"rm -rf {shlex.quote(jobs.run_dir(entry, run_id))}")
        host.close()


# A line the watch prints as it enters each stage: a Ctrl-C sent on reading it lands there.
# (Sleeping between passes: test_ctrl_c_stops_and_the_started_run_goes_on.)
STAGES = {
    "polling the trainer": "watching ",
    "staging": "% of ",
    "launching": "staged and verified",
    "streaming": "target hidden states: ",  # a phase done, the drafter's to come
    "pulling and summarising": "results pulled to",
}


@pytest.mark.parametrize("stage", STAGES)
def test_ctrl_c_in_every_stage_stops_the_watch(e2e_lab, trainer, tmp_path, stage):
    """Steps 2000 and 4000 new, one eval host: wherever it lands, a Ctrl-C ends the watch
    (130) with its summary, and no run starts after it but one it was launching, named."""
    trainer.only(2000, 4000)
    lab = one_eval_host(e2e_lab, tmp_path)
    watching, seen = watch_until(lab, STAGES[stage])
    before = run_dirs(lab)
    output = interrupt(watching, seen)
    flat = " ".join(output.split())
    assert watching.returncode == 130, output
    assert "watch stopped: no further step is started." in flat, output
    late = run_dirs(lab) - before
    assert all(f"run {run_id} goes on on eval" in flat for run_id in late), output
    assert WatchState.load(load(lab.inventory_path).local.results, None).attempts == {}, output
