"""What the listing, `fab eval-status` and `fab eval-cancel` make of the run directories on a
real lab eval host: a failed run's reason, a damaged params file or an odd directory name
listed as a broken run while the listing goes on, and pid files as claims the host verifies
(a stale, unverifiable or malformed one is never signalled). The runs themselves:
test_jobs.py."""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from dflash_ops.evaluation import jobs
from tests.lab.conftest import fake


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


def test_a_failed_run_s_status_says_why(eval_host, lab, fab):
    host, entry = eval_host
    run_id = jobs.new_run_id(2000, "eval")
    jobs.launch(host, entry, run_id, fake(1, "fail"), {"step": 2000})
    assert jobs.wait_finished(host, entry, run_id, timeout=60).state == "failed"
    record = status_of(fab, lab, run_id)
    assert (record["state"], record["problem"]) == ("failed", "boom: the drafter exploded")
    assert "boom: the drafter exploded" in fab(lab.inventory_path, "eval-status").stdout


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
