"""Detached runs on a real lab eval host: launch, busy refusal, follow, cancel, kill, fetch,
and a full disk at launch or while fetching.

The command run here is the stand-in harness of tests/lab/conftest.py (`fake`); run-eval's
own tests run the real harness. A run that a test needs "still running" is *gated*: it
blocks on a FIFO in its run directory until the test opens the gate (or stops the run), so
no test depends on how fast anything runs. What eval-status and the listing make of a run
directory: test_run_status.py.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from dflash_ops.core.errors import DiskSpaceError, JobError
from dflash_ops.core.inventory import load
from dflash_ops.evaluation import jobs
from tests.lab.conftest import fake


def open_gate(host, entry, run_id: str) -> None:
    """Let a gated run finish. Call it only after the run printed an event (the gate exists
    then); `timeout` only bounds a broken test, it is not a wait."""
    gate = shlex.quote(f"{jobs.run_dir(entry, run_id)}/gate")
    host.run(f"timeout 60 sh -c {shlex.quote(f'printf go > {gate}')}")


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


def test_run_files_are_private_whatever_the_login_umask(eval_host):
    host, entry = eval_host
    run_id = jobs.new_run_id(2000, "eval")
    jobs.launch(host, entry, run_id, fake(1), {"step": 2000})
    jobs.wait_finished(host, entry, run_id, timeout=60)
    directory = shlex.quote(jobs.run_dir(entry, run_id))
    modes = host.run(f"cd {directory} && stat -c '%n %a' . params.json log").stdout.split("\n")
    assert modes[:3] == [". 700", "params.json 600", "log 600"]


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
