"""`fab watch` on a lab with a tiny target, trained drafter checkpoints and two provisioned eval
hosts: checkpoints appear while it runs, each step is evaluated once, a restart re-runs
nothing, a corrupt checkpoint is retried then skipped, a busy host is waited for, and a
webhook on a local HTTP server (127.0.0.1) receives the news. Ctrl-C: test_watch_interrupt.py;
the state file and the webhook alone: tests/unit."""

from __future__ import annotations

import json

import pytest

from dflash_lab import lab as labs
from dflash_ops.core.inventory import load
from dflash_ops.evaluation import jobs
from dflash_ops.evaluation.request import build_request
from dflash_ops.evaluation.results import load_runs
from dflash_ops.evaluation.watch import Watch, WatchOptions, WatchState
from dflash_ops.evaluation.webhook import Webhook
from dflash_ops.remote.connection import Host
from dflash_ops.ui.watch_view import WatchView
from tests.conftest import run_fab
from tests.e2e.conftest import pulled_steps, runs_on_hosts

pytestmark = pytest.mark.long(205)  # seconds in a cold `make test` (5 workers)

QUICK_OPTIONS = {"num_prompts": "2", "max_new_tokens": "24", "ddtree": "4,8"}
QUICK = ["--num-prompts", "2", "--max-new-tokens", "24", "--ddtree", "4,8"]


def a_watch(lab: labs.Lab, view: WatchView, webhook: Webhook | None = None, **options) -> Watch:
    template = build_request(step=0, host=None, harness_options=QUICK_OPTIONS, prompts=None)
    return Watch(load(lab.inventory_path), template, view, WatchOptions(**options), webhook)


def test_new_checkpoints_are_evaluated_once_as_they_appear(e2e_lab, trainer, hook):
    trainer.only(2000, 4000)

    class ThenStep6000Appears(WatchView):
        def pass_done(self, outcome, next_in_s):
            super().pass_done(outcome, next_in_s)
            if outcome.number == 1:
                trainer.appear(6000)

    webhook = Webhook(hook.url(), print)
    watch = a_watch(e2e_lab, ThenStep6000Appears(), webhook, interval_s=0, max_passes=3)
    passes = watch.run()
    webhook.close()
    assert [sorted(p.evaluated) for p in passes] == [[2000, 4000], [6000], []]
    assert not any(p.failed or p.skipped or p.error for p in passes)
    assert pulled_steps(e2e_lab) == [2000, 4000, 6000]
    assert {run.host for run in runs_on_hosts(e2e_lab)} == {"eval", "eval2"}  # in parallel
    state = json.loads(watch.state.path.read_text())
    assert sorted(state["evaluated"]) == ["2000", "4000", "6000"]
    assert state["attempts"] == {} and state["skipped"] == {}

    posts = hook.received()
    assert sorted(post["step"] for post in posts) == [2000, 4000, 6000]
    keys = {row.run_id: row.key_id for row in load_runs(load(e2e_lab.inventory_path).local.results)}
    for post in posts:
        assert post["event"] == "evaluated" and post["tau_macro"] > 0
        assert post["run_id"] == state["evaluated"][str(post["step"])]
        assert post["failures"] == {}
        assert post["comparability_key"] == keys[post["run_id"]]  # as compare shows it
        assert post["comparability"]["max new tokens"] == int(QUICK_OPTIONS["max_new_tokens"])

    # A restart (the real task) re-runs nothing; nor does one without its state file: the
    # successful local results count.
    again = run_fab(e2e_lab.inventory_path, "watch", "--once", *QUICK)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "pass 1: nothing new" in again.stdout
    watch.state.path.unlink()
    fresh = a_watch(e2e_lab, WatchView(), interval_s=0, max_passes=1).run()
    assert fresh[0].evaluated == [] and fresh[0].error is None
    assert len(runs_on_hosts(e2e_lab)) == 3


def test_a_failing_step_is_retried_then_skipped(e2e_lab, trainer, hook):
    trainer.only(2000)
    trainer.appear(8000, b"not a checkpoint at all " * 1000)  # complete, but corrupt
    # Step 2000 goes through; step 8000 fails its first attempt: exit status 1.
    first = run_fab(
        e2e_lab.inventory_path,
        "watch",
        "--once",
        "--retries",
        "1",
        "--webhook",
        hook.url(),
        *QUICK,
    )
    assert first.returncode == 1, first.stdout + first.stderr
    assert "step 8000 failed (attempt 1 of 2); tried again next pass" in first.stdout
    assert "watch: step(s) 8000 failed" in first.stderr
    # A restart carries the attempt on: the second fails too and the step is skipped.
    webhook = Webhook(hook.url(), print)
    watch = a_watch(e2e_lab, WatchView(), webhook, interval_s=0, retries=1, max_passes=2)
    passes = watch.run()
    webhook.close()
    assert [(p.evaluated, p.failed, p.skipped) for p in passes] == [([], [], [8000]), ([], [], [])]
    state = json.loads(watch.state.path.read_text())
    assert list(state["evaluated"]) == ["2000"] and list(state["skipped"]) == ["8000"]
    assert state["attempts"] == {}
    assert "exit code" in state["skipped"]["8000"]  # the last error, kept for the user
    assert pulled_steps(e2e_lab).count(8000) == 2  # two attempts, then no more

    posts = hook.received()
    # The first run's two steps end on two hosts in parallel: their order is not fixed.
    assert sorted((p["event"], p["step"]) for p in posts) == [
        ("evaluated", 2000),
        ("failed", 8000),
        ("skipped", 8000),
    ]
    failed = next(p for p in posts if p["event"] == "failed")
    assert failed["attempts"] == 1 and failed["failures"] == {"8000": {"attempts": 1}}
    skipped = next(p for p in posts if p["event"] == "skipped")
    assert skipped["attempts"] == 2 and skipped["failures"] == {"8000": {"skipped": True}}


def test_a_busy_host_is_a_wait_not_a_failed_attempt(e2e_lab, trainer):
    """Every eval host runs something else (a run by hand of another training run): the
    step waits, spends no attempt even with --retries 0, and is evaluated once a host is
    free."""
    trainer.only(2000)
    inventory = load(e2e_lab.inventory_path)
    holders = []
    for name, entry in inventory.eval_hosts.items():
        host = Host(inventory, name)
        run_id = f"by-hand-{name}"
        jobs.launch(host, entry, run_id, "sleep 600", {"step": 1, "training_run": "by-hand"})
        holders.append((host, entry, run_id))
    first = a_watch(e2e_lab, WatchView(), interval_s=0, retries=0, max_passes=2).run()
    assert [(p.waiting, p.failed, p.skipped, p.evaluated) for p in first] == [
        ([2000], [], [], []),
        ([2000], [], [], []),
    ]
    state = WatchState.load(inventory.local.results, None)  # no attempt spent, none saved
    assert (state.attempts, state.skipped, state.evaluated) == ({}, {}, {})
    for host, entry, run_id in holders:
        jobs.cancel(host, entry, jobs.wait_finished(host, entry, run_id, timeout=0))
        jobs.wait_finished(host, entry, run_id)
        host.close()
    [freed] = a_watch(e2e_lab, WatchView(), interval_s=0, retries=0, max_passes=1).run()
    assert (freed.evaluated, freed.waiting, freed.failed) == ([2000], [], [])
