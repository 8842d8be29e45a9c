"""`fab watch` on a lab with a tiny target, trained drafter checkpoints and two provisioned eval
hosts: checkpoints appear while it runs, each step is evaluated once, a restart re-runs
nothing, a corrupt checkpoint is retried then skipped, Ctrl-C leaves the started run going,
and a webhook on a local HTTP server (127.0.0.1) receives the news."""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dflash_lab import lab as labs
from dflash_ops.core.errors import WatchError
from dflash_ops.core.inventory import load
from dflash_ops.evaluation import jobs
from dflash_ops.evaluation.request import build_request
from dflash_ops.evaluation.results import load_runs
from dflash_ops.evaluation.watch import (
    Watch,
    WatchOptions,
    WatchState,
    parse_interval,
)
from dflash_ops.evaluation.webhook import Webhook
from dflash_ops.remote.connection import Host
from dflash_ops.ui.console import console
from dflash_ops.ui.watch_view import WatchView, _show_stopped
from tests.conftest import run_fab, start_fab
from tests.e2e.conftest import one_eval_host

pytestmark = pytest.mark.long(255)  # seconds with 4 workers: started first

STEPS = (2000, 4000, 6000)
QUICK_OPTIONS = {"num_prompts": "2", "max_new_tokens": "24", "ddtree": "4,8"}
QUICK = ["--num-prompts", "2", "--max-new-tokens", "24", "--ddtree", "4,8"]


# --- a webhook endpoint on loopback ---------------------------------------------------------


class HookServer:
    """Records each POSTed JSON body; answers with the queued statuses, then 200."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.posts: queue.Queue[dict] = queue.Queue()
        self.statuses = list(statuses or [])
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.posts.put(json.loads(body))
                self.send_response(server.statuses.pop(0) if server.statuses else 200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.http.server_port}{path}"

    def received(self) -> list[dict]:
        found = []
        while not self.posts.empty():
            found.append(self.posts.get_nowait())
        return found

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def hook() -> Iterator[HookServer]:
    server = HookServer()
    yield server
    server.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- without a lab ----------------------------------------------------------------------------


def test_interval_parsing():
    assert [parse_interval(t) for t in ("90s", "10m", "1h30m", "45", "0s")] == [
        90,
        600,
        5400,
        45,
        0,
    ]
    with pytest.raises(WatchError, match=r"expected e\.g\. 90s, 10m"):
        parse_interval("ten minutes")


def test_state_round_trip_and_an_unreadable_state_file(tmp_path):
    state = WatchState.load(tmp_path, "nightly run")
    state.evaluated[2000] = "run-a"
    state.attempts[4000] = 1
    state.skipped[6000] = "boom"
    state.save()
    assert state.path.name == "watch-state-nightly_run.json"
    again = WatchState.load(tmp_path, "nightly run")
    assert (again.evaluated, again.attempts, again.skipped) == (
        {2000: "run-a"},
        {4000: 1},
        {6000: "boom"},
    )
    assert [p.name for p in tmp_path.iterdir()] == [state.path.name]  # no partial left behind
    state.path.write_text('{"evaluated": [')
    with pytest.raises(WatchError, match="Move it aside"):
        WatchState.load(tmp_path, "nightly run")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ('{"evaluated": {}, "attempts": {"4000": "two"}, "skipped": {}}', "attempts.4000"),
        ('{"evaluated": {}, "attempts": {"x": 1}, "skipped": {}}', "invalid literal"),
        ('{"evaluated": ' * 200 + "{}" + "}" * 200, "nested deeper than 32"),
    ],
)
def test_a_watch_state_of_the_wrong_shape_is_one_line(tmp_path, content, why):
    path = WatchState.file_for(tmp_path, None)
    path.write_text(content)
    with pytest.raises(WatchError, match="Move it aside") as refused:
        WatchState.load(tmp_path, None)
    assert why in str(refused.value)


def test_webhook_retries_a_failing_endpoint():
    server = HookServer(statuses=[500, 503])
    said: list[str] = []
    webhook = Webhook(server.url(), said.append, backoff_s=0.01)
    webhook.post({"step": 1})
    webhook.close()
    server.close()
    assert [post["step"] for post in server.received()] == [1, 1, 1]
    assert (webhook.delivered, webhook.dropped, said) == (1, 0, [])


def test_webhook_down_never_blocks_and_never_shows_credentials():
    said: list[str] = []
    url = f"http://user:s3cret@127.0.0.1:{free_port()}/T0/tok3n?key=hidd3n"
    webhook = Webhook(url, said.append, backoff_s=0.01)
    webhook.post({"step": 1})  # returns at once: delivery happens on the webhook's thread
    webhook.post({"step": 2})
    webhook.close()
    assert (webhook.delivered, webhook.dropped) == (0, 2)
    assert len(said) == 2 and "not delivered" in said[0] and "ConnectionError" in said[0]
    for secret in ("s3cret", "tok3n", "hidd3n", "user"):
        assert not any(secret in line for line in said), said


# --- on a lab ---------------------------------------------------------------------------------


class Trainer:
    """Hides the lab's checkpoints and makes them appear (as a trainer writes them: to a
    temporary name, then renamed), or writes a corrupt one."""

    def __init__(self, lab: labs.Lab, held: Path) -> None:
        self.lab, self.held = lab, held
        held.mkdir()
        for step in STEPS:
            shutil.copyfile(lab.checkpoint_path(step), held / str(step))
        self.only()

    def only(self, *steps: int) -> None:
        for step in STEPS:
            if step not in steps:
                shutil.rmtree(self.lab.checkpoint_path(step).parent, ignore_errors=True)
        for step in steps:
            self.appear(step)

    def appear(self, step: int, content: bytes | None = None) -> None:
        path = self.lab.checkpoint_path(step)
        path.parent.mkdir(exist_ok=True)
        temporary = path.with_name(".writing")
        if content is None:
            shutil.copyfile(self.held / str(step), temporary)
        else:
            temporary.write_bytes(content)
        temporary.replace(path)

    def restore(self) -> None:
        shutil.rmtree(self.lab.checkpoint_path(8000).parent, ignore_errors=True)
        self.only(*STEPS)


@pytest.fixture
def trainer(e2e_lab, tmp_path) -> Iterator[Trainer]:
    """The lab with no checkpoint yet; afterwards its checkpoints, runs and results as before."""
    made = Trainer(e2e_lab, tmp_path / "held")
    yield made
    made.restore()
    inventory = load(e2e_lab.inventory_path)
    for name, entry in inventory.eval_hosts.items():
        host = Host(inventory, name)
        for run in jobs.list_runs(host, entry):
            if not run.done:
                jobs.cancel(host, entry, run)
                jobs.wait_finished(host, entry, run.run_id)
        host.run(f"rm -rf {shlex.quote(jobs.runs_dir(entry))}")
        host.close()
    subprocess.run(["rm", "-rf", str(inventory.local.results)], check=True)


def a_watch(lab: labs.Lab, view: WatchView, webhook: Webhook | None = None, **options) -> Watch:
    template = build_request(step=0, host=None, harness_options=QUICK_OPTIONS, prompts=None)
    return Watch(load(lab.inventory_path), template, view, WatchOptions(**options), webhook)


def pulled_steps(lab: labs.Lab) -> list[int]:
    results = load(lab.inventory_path).local.results
    return sorted(json.loads(p.read_text())["step"] for p in results.glob("*/run.json"))


def runs_on_hosts(lab: labs.Lab) -> list[jobs.Run]:
    return jobs.all_runs(load(lab.inventory_path))


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


def test_webhook_posts_carry_a_chat_text_line(hook):
    webhook = Webhook(hook.url(), print, backoff_s=0.01)
    evaluated = {
        "source": "dflash-ops watch",
        "event": "evaluated",
        "training_run": "v5",
        "step": 4000,
        "host": "eval",
        "run_id": "20261201-1203-v5-step4000-eval-ab12",
        "tau_macro": 3.14159,
        "tau_macro_ci": [3.01, 3.25],
    }
    failed = {
        "source": "dflash-ops watch",
        "event": "failed",
        "step": 6000,
        "attempts": 2,
        "error": "exit code 2: checkpoint refused\nmore detail",
    }
    webhook.post(evaluated)
    webhook.post(failed)
    webhook.close()
    posts = hook.received()
    assert [post["text"] for post in posts] == [
        "dflash-ops watch: step 4000 (training run v5) evaluated on eval: τ 3.142 [3.010, "
        "3.250] — run 20261201-1203-v5-step4000-eval-ab12",
        "dflash-ops watch: step 6000 failed after 2 attempt(s): exit code 2: checkpoint refused",
    ]
    assert {k: v for k, v in posts[0].items() if k != "text"} == evaluated  # the JSON as before


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
