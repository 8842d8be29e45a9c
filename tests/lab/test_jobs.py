"""Detached runs on a real lab eval host: launch, busy refusal, follow, cancel, kill, fetch.

The command run here is a small Python script that behaves like the harness (JSON events on
stdout, text on stderr, a results file); run-eval's own tests run the real harness. A run
that a test needs "still running" is *gated*: it blocks on a FIFO in its run directory until
the test opens the gate (or stops the run), so no test depends on how fast anything runs.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from dflash_ops.core.errors import DiskSpaceError, JobError
from dflash_ops.core.inventory import load
from dflash_ops.evaluation import jobs, run_listing
from dflash_ops.remote.connection import Host

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


def open_gate(host, entry, run_id: str) -> None:
    """Let a gated run finish. Call it only after the run printed an event (the gate exists
    then); `timeout` only bounds a broken test, it is not a wait."""
    gate = shlex.quote(f"{jobs.run_dir(entry, run_id)}/gate")
    host.run(f"timeout 60 sh -c {shlex.quote(f'printf go > {gate}')}")


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


def test_run_is_followed_fetched_once(eval_host, tmp_path):
    host, entry = eval_host
    run_id = jobs.new_run_id(2000, "eval", tag="t1")
    jobs.launch(host, entry, run_id, fake(4), {"step": 2000, "tag": "t1"})
    lines: list[str] = []
    run = jobs.follow(host, entry, run_id, "events.jsonl", lines.append)
    assert run.state == "succeeded" and run.exit_code == 0
    assert [e["done"] for e in jobs.parse_events(lines)] == [1, 2, 3, 4]
    fetched = jobs.fetch(host, entry, run, tmp_path)
    assert fetched == tmp_path / run_id
    assert json.loads((fetched / "results.json").read_text()) == {"ok": True}
    assert "working 3" in (fetched / "log").read_text()
    summary = json.loads((fetched / "run.json").read_text())
    assert (summary["state"], summary["step"], summary["tag"]) == ("succeeded", 2000, "t1")
    before = {p.name: p.stat().st_mtime_ns for p in fetched.iterdir()}
    assert jobs.fetch(host, entry, run, tmp_path) is None  # twice changes nothing
    assert {p.name: p.stat().st_mtime_ns for p in fetched.iterdir()} == before


def test_busy_host_refuses_a_second_run(eval_host):
    host, entry = eval_host
    first = jobs.new_run_id(2000, "eval")
    jobs.launch(host, entry, first, fake(1, gated=True), {"step": 2000})
    with pytest.raises(jobs.JobError, match=rf"eval is busy with run {first} \(step 2000"):
        jobs.launch(host, entry, jobs.new_run_id(4000, "eval"), fake(1), {"step": 4000})
    run = next(r for r in jobs.list_runs(host, entry) if r.run_id == first)
    jobs.cancel(host, entry, run)
    assert jobs.wait_finished(host, entry, first).state == "cancelled"
    with pytest.raises(jobs.JobError, match="already cancelled"):
        jobs.cancel(host, entry, jobs.wait_finished(host, entry, first))


def test_a_listing_of_one_run_or_of_the_unfinished_ones_reads_only_those(eval_host):
    """What launch's busy check and wait_finished ask for: a whole listing reads every run
    directory, seconds on a host that has kept hundreds."""
    host, entry = eval_host
    finished = jobs.new_run_id(2000, "eval", tag="finished")
    jobs.launch(host, entry, finished, fake(1), {"step": 2000})
    assert jobs.wait_finished(host, entry, finished).state == "succeeded"
    running = jobs.new_run_id(4000, "eval", tag="running")
    jobs.launch(host, entry, running, fake(1, gated=True), {"step": 4000})  # stopped at teardown
    assert [run.run_id for run in jobs.list_runs(host, entry, finished)] == [finished]
    assert [run.run_id for run in jobs.list_runs(host, entry, unfinished=True)] == [running]
    assert jobs.list_runs(host, entry, "20000101-000000-step1-eval-none") == []
    assert {run.run_id for run in jobs.list_runs(host, entry)} == {finished, running}


def test_lock_is_the_last_word_even_when_the_listing_misses_a_run(eval_host, monkeypatch):
    """Two launches racing past the listing: the flock in the wrapper refuses the second."""
    host, entry = eval_host
    holder = jobs.new_run_id(2000, "eval")
    jobs.launch(host, entry, holder, fake(1, gated=True), {"step": 2000})
    loser = jobs.new_run_id(4000, "eval")
    with monkeypatch.context() as patch:
        patch.setattr(jobs, "list_runs", lambda *_, **__: [])  # the first run not visible yet
        with pytest.raises(jobs.JobError, match="took the host's eval lock first"):
            jobs.launch(host, entry, loser, fake(1), {"step": 4000})
    assert loser not in [r.run_id for r in jobs.list_runs(host, entry)]  # its dir was removed
    jobs.cancel(host, entry, next(r for r in jobs.list_runs(host, entry) if r.run_id == holder))
    assert jobs.wait_finished(host, entry, holder).state == "cancelled"


def test_failed_and_killed_runs_report_exit_code_and_log(eval_host):
    host, entry = eval_host
    failing = jobs.new_run_id(2000, "eval")
    jobs.launch(host, entry, failing, fake(2, "fail"), {"step": 2000})
    run = jobs.follow(host, entry, failing, "events.jsonl", lambda line: None)
    assert (run.state, run.exit_code) == ("failed", 3)
    assert "boom: the drafter exploded" in jobs.log_tail(host, entry, failing)

    killed = jobs.new_run_id(4000, "eval")
    jobs.launch(host, entry, killed, fake(1, gated=True), {"step": 4000})
    pid = host.run(f"cat {shlex.quote(jobs.run_dir(entry, killed))}/pid").stdout.strip()
    host.run(f"kill -KILL {pid}")
    run = jobs.wait_finished(host, entry, killed)
    assert (run.state, run.exit_code) == ("failed", 137)


def test_run_survives_the_workstation_reader(eval_host, tmp_path):
    """Stopping the local reader (Ctrl-C, closed laptop) leaves the remote run going."""
    host, entry = eval_host
    run_id = jobs.new_run_id(2000, "eval")
    jobs.launch(host, entry, run_id, fake(8, gated=True), {"step": 2000})

    def interrupt(line: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        jobs.follow(host, entry, run_id, "events.jsonl", interrupt)
    assert next(r for r in jobs.list_runs(host, entry) if r.run_id == run_id).state == "running"
    open_gate(host, entry, run_id)
    lines: list[str] = []
    run = jobs.follow(host, entry, run_id, "events.jsonl", lines.append)  # until it exits
    assert run.state == "succeeded" and len(list(jobs.parse_events(lines))) == 8
    assert jobs.fetch(host, entry, run, tmp_path) is not None


def test_parse_runs_states():
    # pid: the host's verdict on the harness's pid file, alive: on the wrapper's
    line = "r1\t{code}\t{pid}\t{alive}\t{results}\t{finished}\t-\t-\t{params}"
    params = json.dumps({"step": 2000, "started": 1000.0})

    def state(**fields) -> str:
        values = {
            "code": "-",
            "pid": "gone 42",
            "alive": "gone 41",
            "results": "no",
            "finished": "-",
            "params": params,
            **fields,
        }
        return run_listing.parse_runs("eval", line.format(**values), now=1010.0)[0].state

    assert state(alive="live 41") == "running"
    assert state(code="0", results="yes", finished="1005") == "succeeded"
    assert state(code="0") == "failed"  # exit 0 without results is not a success
    assert state(code="137") == "failed"
    assert state(pid="none") == "starting"
    assert state() == "lost"
    assert state(code="143", results="cancelled") == "cancelled"
    # A features run's product is its feature set, not results.json.
    features = json.dumps({"kind": "features", "started": 1000.0})
    assert state(code="0", params=features) == "succeeded"
    assert state(code="2", params=features) == "failed"


def test_run_ids_name_a_named_training_run_and_keep_the_default_as_it_was():
    default = jobs.new_run_id(4000, "eval", tag="t1")
    named = jobs.new_run_id(4000, "eval", tag="t1", training_run="v4")
    assert re.fullmatch(r"\d{8}-\d{6}-step4000-eval-t1-[0-9a-f]{4}", default)
    assert re.fullmatch(r"\d{8}-\d{6}-v4-step4000-eval-t1-[0-9a-f]{4}", named)
    assert "-step4000-" in jobs.new_run_id(4000, "eval", training_run="a/b c")  # made safe
    assert "/" not in jobs.new_run_id(4000, "eval", training_run="a/b c")


def test_a_failed_run_is_fetched_without_a_results_file(eval_host, tmp_path):
    """paramiko creates the local file before it finds the remote one missing: no empty
    results.json may be left to stand for the results the run never wrote."""
    host, entry = eval_host
    run_id = jobs.new_run_id(2000, "eval")
    jobs.launch(host, entry, run_id, fake(1, "fail"), {"step": 2000})
    run = jobs.wait_finished(host, entry, run_id, timeout=60)
    assert run.state == "failed"
    fetched = jobs.fetch(host, entry, run, tmp_path)
    assert not (fetched / "results.json").exists()
    assert "boom: the drafter exploded" in (fetched / "log").read_text()
    assert json.loads((fetched / "run.json").read_text())["state"] == "failed"


def test_a_truncated_params_file_lists_the_run_as_broken(eval_host, lab, fab, tmp_path):
    host, entry = eval_host
    good = jobs.new_run_id(2000, "eval")
    jobs.launch(host, entry, good, fake(1), {"step": 2000})
    jobs.wait_finished(host, entry, good, timeout=60)
    broken = f"{jobs.runs_dir(entry)}/20250101-000000-step4000-eval-dead"
    host.run(f"mkdir -p {shlex.quote(broken)} && printf '{{\"step\": 40' > {broken}/params.json")
    runs = {run.run_id: run for run in jobs.list_runs(host, entry)}
    assert runs[good].state == "succeeded"
    dead = runs["20250101-000000-step4000-eval-dead"]
    assert dead.state == "broken" and "params.json: not valid JSON" in dead.problem
    status = fab(lab.inventory_path, "eval-status")
    assert status.returncode == 0, status.stderr
    assert "broken" in status.stdout and good in status.stdout


def test_odd_run_directories_are_listed_broken_and_the_listing_goes_on(eval_host, lab, fab):
    """A text `started` (crashed eval-status and run-eval's busy check: TypeError), and a
    directory whose name holds a newline (crashed the listing: one record became two)."""
    host, entry = eval_host
    good = jobs.new_run_id(2000, "eval")
    jobs.launch(host, entry, good, fake(1), {"step": 2000})
    jobs.wait_finished(host, entry, good, timeout=60)
    runs = jobs.runs_dir(entry)
    text_started = shlex.quote(f"{runs}/20250101-000000-step4000-eval-text")
    newline = shlex.quote(f"{runs}/20250101-000000-step6000\t-eval\nodd")
    host.run(
        f"mkdir -p {text_started} {newline} && "
        f'echo \'{{"step": 4000, "started": "yesterday"}}\' > {text_started}/params.json && '
        f'echo \'{{"step": 6000, "started": 1}}\' > {newline}/params.json'
    )
    listed = {run.run_id: run for run in jobs.list_runs(host, entry)}
    assert listed[good].state == "succeeded"
    text = listed["20250101-000000-step4000-eval-text"]
    assert text.state == "broken" and "started: input should be a valid number" in text.problem
    odd = listed["20250101-000000-step6000\\x01-eval\\x01odd"]
    assert odd.state == "broken" and "control characters" in odd.problem
    status = fab(lab.inventory_path, "eval-status")
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("broken") >= 2 and good in status.stdout
    host.run(f"rm -rf -- {text_started} {newline}")


def test_parse_runs_never_fails_on_one_bad_line():
    output = (
        'a\t0\tgone 1\tgone 2\tyes\t5\t-\t-\t{"step": 1, "started": 1}\0'
        "b\t-\tnone\tnone\tno\t-\t-\t-\t[1]\0"
    )
    bad, good = run_listing.parse_runs("eval", output, now=100)  # oldest first; b has no start
    assert (good.run_id, good.state) == ("a", "succeeded")
    assert (bad.run_id, bad.state, bad.problem) == (
        "b",
        "broken",
        "params.json: expected a JSON object, found list",
    )


def test_run_files_are_private_whatever_the_login_umask(eval_host):
    host, entry = eval_host
    run_id = jobs.new_run_id(2000, "eval")
    jobs.launch(host, entry, run_id, fake(1), {"step": 2000})
    jobs.wait_finished(host, entry, run_id, timeout=60)
    directory = shlex.quote(jobs.run_dir(entry, run_id))
    modes = host.run(f"cd {directory} && stat -c '%n %a' . params.json log").stdout.split("\n")
    assert modes[:3] == [". 700", "params.json 600", "log 600"]


# --- pid files are claims the host verifies ----------------------------------------------

PLANTED = "20250101-000000-step4000-eval-planted"


@contextmanager
def unrelated_process(host) -> Iterator[int]:
    """A process on the eval host that no run made (a `sleep`), ended after."""
    pid = int(host.run("sleep 600 </dev/null >/dev/null 2>&1 & echo $!").stdout)
    try:
        yield pid
    finally:
        host.run(f"kill {pid} 2>/dev/null; true")


def alive(host, pid: int) -> bool:
    """Not ended (a zombie counts as ended, whoever reaps it)."""
    stat = host.run(f"cat /proc/{pid}/stat 2>/dev/null || true").stdout
    return bool(stat) and stat.rpartition(") ")[2][:1] not in "ZX"


@contextmanager
def planted_run(host, entry, files: dict[str, str]) -> Iterator[str]:
    """A run directory with `files` (name: content) and a start long ago, removed after."""
    directory = f"{jobs.runs_dir(entry)}/{PLANTED}"
    files = {"params.json": json.dumps({"step": 4000, "started": 1.0}), **files}
    writes = " && ".join(
        f"printf %s {shlex.quote(text)} > {shlex.quote(f'{directory}/{name}')}"
        for name, text in files.items()
    )
    host.run(f"mkdir -p {shlex.quote(directory)} && {writes}")
    try:
        yield directory
    finally:
        host.run(f"rm -rf -- {shlex.quote(directory)}")


def status_of(fab, lab, run_id: str) -> dict:
    status = fab(lab.inventory_path, "eval-status", "--format", "json")
    assert status.returncode == 0, status.stderr
    return next(record for record in json.loads(status.stdout) if record["run_id"] == run_id)


def refused_cancel(fab, lab, run_id: str) -> str:
    cancelled = fab(lab.inventory_path, "eval-cancel", "--id", run_id)
    assert cancelled.returncode == 1, cancelled.stdout + cancelled.stderr
    line = cancelled.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    return line


def test_a_pid_file_naming_another_live_process_is_stale_and_never_signalled(eval_host, lab, fab):
    """The pid of a run's harness, now another program's (or planted): its start time is
    not the one recorded. Neither cancel, status nor a follower takes it for the run."""
    host, entry = eval_host
    with unrelated_process(host) as pid:
        with planted_run(host, entry, {"pid": f"{pid}\n", "pid.start": "1\n"}) as directory:
            record = status_of(fab, lab, PLANTED)
            assert record["state"] == "lost"
            assert record["problem"].startswith(f"not running (stale pid file): process {pid} ")
            line = refused_cancel(fab, lab, PLANTED)
            assert line.startswith(f"error: eval: nothing signalled for the run in {directory}: ")
            assert "not running (stale pid file)" in line
            assert alive(host, pid)
            # Printed as it is, not followed until that process ends (the bound only stops
            # a failing test).
            follower = threading.Thread(
                target=jobs.follow, args=(host, entry, PLANTED, "log", print), daemon=True
            )
            follower.start()
            follower.join(timeout=60)
            assert not follower.is_alive()
            table = fab(lab.inventory_path, "eval-status").stdout
            assert "not running (stale pid file)" in table
        assert alive(host, pid)


def test_a_pid_file_without_a_start_time_is_unverified_and_never_signalled(eval_host, lab, fab):
    """A run directory written before start times were recorded (or a planted pid file):
    whether its live pid is the run's cannot be told, so it is left to the user."""
    host, entry = eval_host
    with (
        unrelated_process(host) as pid,
        planted_run(host, entry, {"pid": f"{pid}\n", "wrapper.pid": f"{pid}\n"}) as where,
    ):
        record = status_of(fab, lab, PLANTED)
        assert record["state"] == "unverified"
        assert "records no start time" in record["problem"]
        assert f"`ps -o pid,lstart,args -p {pid}` on eval" in record["problem"]
        assert "kill it yourself" in record["problem"]
        line = refused_cancel(fab, lab, PLANTED)
        assert line.startswith(f"error: eval: nothing signalled for the run in {where}: ")
        assert "kill it yourself" in line
        assert alive(host, pid)


@pytest.mark.parametrize("content", ["-1\n", "0\n", "abc\n", ""])
def test_a_pid_file_without_a_process_id_is_a_broken_run_never_signalled(
    eval_host, lab, fab, content
):
    host, entry = eval_host
    with (
        unrelated_process(host) as pid,
        planted_run(host, entry, {"pid": content, "pid.start": "1\n"}) as directory,
    ):
        # Checked before cancel is tried: a `kill -TERM -1` reaches every process the login
        # may signal.
        run = next(r for r in jobs.list_runs(host, entry) if r.run_id == PLANTED)
        assert run.state == "broken", run
        shown = content.strip()
        assert run.problem == (
            f"its pid file holds {shown!r}, not a process id: a broken run, never signalled"
        )
        line = refused_cancel(fab, lab, PLANTED)
        assert line == f"error: eval: nothing signalled for the run in {directory}: {run.problem}"
        assert status_of(fab, lab, PLANTED)["state"] == "broken"
        assert alive(host, pid)


def test_a_failed_run_s_status_says_why(eval_host, lab, fab):
    host, entry = eval_host
    run_id = jobs.new_run_id(2000, "eval")
    jobs.launch(host, entry, run_id, fake(1, "fail"), {"step": 2000})
    assert jobs.wait_finished(host, entry, run_id, timeout=60).state == "failed"
    record = status_of(fab, lab, run_id)
    assert (record["state"], record["problem"]) == ("failed", "boom: the drafter exploded")
    assert "boom: the drafter exploded" in fab(lab.inventory_path, "eval-status").stdout


# --- a full disk ------------------------------------------------------------------------------


@contextmanager
def filled(lab, directory: Path) -> Iterator[None]:
    """`directory`'s filesystem (one of the lab's size-limited tmpfs disks) with no byte
    free while inside; as it was after."""
    if lab.state.mode != "netns":
        pytest.skip("needs the lab's tmpfs disks (root)")
    filler = directory / ".filler"
    handle = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        # Most of it in one call (writing gigabytes through a buffer costs seconds of CPU),
        # then writes until the very last byte is taken.
        space = os.statvfs(directory)
        with suppress(OSError):
            os.posix_fallocate(handle, 0, space.f_bavail * space.f_frsize - (1 << 20))
        os.lseek(handle, 0, os.SEEK_END)
        for block in (b"\0" * (1 << 20), b"\0" * 4096, b"\0"):
            try:
                while True:
                    os.write(handle, block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
        yield
    finally:
        os.close(handle)
        filler.unlink()


def test_a_full_eval_disk_at_launch_is_one_line_and_leaves_no_run(lab, eval_host):
    host, entry = eval_host
    host.run(f"mkdir -p {shlex.quote(jobs.runs_dir(entry))}")
    run_id = jobs.new_run_id(2000, "eval")
    with filled(lab, lab.data_dir("eval")), pytest.raises(DiskSpaceError) as raised:
        jobs.launch(host, entry, run_id, fake(1), {"step": 2000})
    message = str(raised.value)
    assert message.startswith(f"eval: not enough free space at {jobs.runs_dir(entry)} for run ")
    assert "free 0 B" in message and "\n" not in message and "#!/bin/sh" not in message
    assert jobs.list_runs(host, entry) == []  # no half-made ("lost") run
    jobs.launch(host, entry, run_id, fake(1), {"step": 2000})  # room again: it starts
    assert jobs.wait_finished(host, entry, run_id, timeout=60).state == "succeeded"


def test_a_run_directory_that_already_exists_is_never_taken_or_removed(eval_host):
    host, entry = eval_host
    run_id = jobs.new_run_id(2000, "eval")
    directory = shlex.quote(jobs.run_dir(entry, run_id))
    host.run(f"mkdir -p {directory} && echo mine > {directory}/notes.txt")
    try:
        with pytest.raises(JobError, match="already exists; it is not this run's"):
            jobs.launch(host, entry, run_id, fake(1), {"step": 2000})
        assert host.run(f"ls -A {directory}").stdout.split() == ["notes.txt"]
    finally:
        host.run(f"rm -rf -- {directory}")


def test_a_full_workstation_disk_while_fetching_is_one_line_and_fetching_resumes(
    lab, eval_host, fab
):
    host, entry = eval_host
    run_id = jobs.new_run_id(2000, "eval")
    jobs.launch(host, entry, run_id, fake(200), {"step": 2000})
    assert jobs.wait_finished(host, entry, run_id, timeout=60).state == "succeeded"
    results = load(lab.inventory_path).local.results
    try:
        with filled(lab, lab.workstation_dir):
            refused = fab(lab.inventory_path, "fetch-results")
            left = sorted(p.name for p in results.iterdir()) if results.is_dir() else []
        assert refused.returncode == 1, refused.stdout + refused.stderr
        line = refused.stderr.strip()
        assert "\n" not in line and "Traceback" not in line, line
        assert f"workstation: not enough free space at {results} for run {run_id}'s files" in line
        assert "free 0 B" in line
        assert left == []  # no half-pulled run, no partial
        pulled = fab(lab.inventory_path, "fetch-results")
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        assert json.loads((results / run_id / "results.json").read_text()) == {"ok": True}
    finally:
        subprocess.run(["rm", "-rf", str(results)], check=True)
