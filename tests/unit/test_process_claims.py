"""The pid claim functions (dflash_ops.remote.process_claims) run by this machine's /bin/sh on
its own processes (the same POSIX sh and /proc an eval host has), and the listing's reading of
their verdicts. The lab tier runs them on a host, through cancel and eval-status."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_ops.evaluation.run_listing import parse_runs
from dflash_ops.remote.process_claims import SAID, SHELL, Claim, parse_claim


def sh(script: str, cwd: Path) -> str:
    done = subprocess.run(
        ["/bin/sh", "-c", SHELL + script], cwd=cwd, capture_output=True, text=True, timeout=20
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def judged(directory: Path, name: str = "pid") -> Claim:
    return parse_claim(sh(f"dflash_claim {name}; echo {SAID}", directory))


@pytest.fixture
def odd_sleeper(tmp_path) -> Iterator[subprocess.Popen]:
    """A process whose command name holds spaces and ") ", as /proc/PID/stat shows it."""
    link = tmp_path / "x) 1 2 (y"
    link.symlink_to(shutil.which("sleep"))
    process = subprocess.Popen([str(link), "60"])
    yield process
    process.kill()
    process.wait()


def test_a_recorded_process_is_live_whatever_its_command_name(tmp_path, odd_sleeper):
    assert ") 1 2 (" in Path(f"/proc/{odd_sleeper.pid}/stat").read_text()
    sh(f"dflash_record {odd_sleeper.pid} pid", tmp_path)
    assert (tmp_path / "pid").read_text() == f"{odd_sleeper.pid}\n"
    recorded = (tmp_path / "pid.start").read_text().strip()
    stat = Path(f"/proc/{odd_sleeper.pid}/stat").read_text()
    assert recorded == stat.rpartition(") ")[2].split()[19]  # field 22
    assert judged(tmp_path) == Claim("live", str(odd_sleeper.pid))


def test_the_start_time_is_read_after_the_last_parenthesis_even_across_lines(tmp_path):
    fields = " ".join(str(n) for n in range(3, 30))  # field N holds N
    for comm in ("sleep", "a) 1 2 3 (b", "new\nline) 7"):
        stat = json.dumps(f"42 ({comm}) {fields}")
        found = sh(f'dflash_start_of "$(printf %s {stat})"; echo "$dflash_start"', tmp_path)
        assert found.strip() == "22", comm


def test_a_pid_that_another_process_owns_now_is_stale(tmp_path, odd_sleeper):
    (tmp_path / "pid").write_text(f"{odd_sleeper.pid}\n")
    (tmp_path / "pid.start").write_text("12345\n")  # the start of the process that had it
    assert judged(tmp_path) == Claim("stale", str(odd_sleeper.pid))


def test_a_pid_file_without_a_start_time_is_unverifiable_while_its_pid_lives(tmp_path):
    sleeper = subprocess.Popen(["sleep", "60"])
    (tmp_path / "pid").write_text(f"{sleeper.pid}\n")
    try:
        assert judged(tmp_path) == Claim("unverifiable", str(sleeper.pid))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert judged(tmp_path).verdict == "gone"


def test_an_ended_process_is_gone(tmp_path):
    ended = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout
    (tmp_path / "pid").write_text(ended)
    (tmp_path / "pid.start").write_text("12345\n")
    assert judged(tmp_path) == Claim("gone", ended.strip())
    (tmp_path / "pid.start").write_text("-\n")  # it ended before its start could be read
    assert judged(tmp_path).verdict == "gone"


@pytest.mark.parametrize(
    ("content", "shown"),
    [("-1\n", "-1"), ("0\n", "0"), ("abc", "abc"), ("", ""), ("007", "007"),
     ("99999999", "99999999"), ("12 34", "12?34"), ("1\x1b[2J", "1??2J"), ("\n", "")],
)  # fmt: skip
def test_no_positive_process_id_is_malformed(tmp_path, content, shown):
    (tmp_path / "pid").write_text(content)
    (tmp_path / "pid.start").write_text("12345\n")
    assert judged(tmp_path) == Claim("malformed", shown)


def test_a_damaged_start_file_or_a_pid_file_that_is_no_file_is_malformed(tmp_path):
    (tmp_path / "pid").write_text(f"{os.getpid()}\n")
    (tmp_path / "pid.start").write_text("soon\n")
    assert judged(tmp_path).verdict == "malformed"
    os.mkfifo(tmp_path / "fifo")  # never read: reading it would block
    assert judged(tmp_path, "fifo") == Claim("malformed")
    assert judged(tmp_path, "absent") == Claim("none")


def test_a_verdict_line_is_parsed_or_refused():
    assert parse_claim("live 42\n") == Claim("live", "42")
    assert parse_claim("none") == Claim("none")
    with pytest.raises(ValueError, match="unexpected pid verdict"):
        parse_claim("42 yes")


RECORD = "r1\t{code}\t{harness}\t{wrapper}\t{results}\t-\t-\t{reason}\t{params}"


def listed(**fields) -> tuple[str, str | None]:
    values = {
        "code": "-",
        "harness": "gone 42",
        "wrapper": "gone 41",
        "results": "no",
        "reason": "-",
        "params": json.dumps({"step": 2000, "started": 1000.0}),
        **fields,
    }
    run = parse_runs("eval", RECORD.format(**values), now=1010.0 + 60)[0]
    return run.state, run.problem


def test_liveness_is_the_verdict_on_the_pid_files():
    assert listed(harness="live 42") == ("running", None)
    assert listed(wrapper="live 41") == ("running", None)
    assert listed() == ("lost", None)
    state, problem = listed(harness="stale 42")
    assert state == "lost" and problem.startswith("not running (stale pid file): process 42")
    state, problem = listed(harness="malformed -1")
    assert state == "broken" and "holds '-1', not a process id" in problem
    state, problem = listed(harness="unverifiable 42", wrapper="unverifiable 41")
    assert state == "unverified" and "kill it yourself" in problem
    assert "`ps -o pid,lstart,args -p 42` on eval" in problem


def test_a_failed_run_says_why():
    assert listed(code="2", reason="error: no such checkpoint") == (
        "failed",
        "error: no such checkpoint",
    )
    assert listed(code="137", reason="working 3") == (
        "failed",
        "ended by signal 9; its log ends: working 3",
    )
    assert listed(code="1") == ("failed", "exit code 1, nothing in its log")
    assert listed(code="0") == ("failed", "exited 0 without writing its results")
    assert listed(code="3", reason="bad \x1b[2J") == ("failed", "bad \\x1b[2J")
    assert listed(code="0", results="yes") == ("succeeded", None)
