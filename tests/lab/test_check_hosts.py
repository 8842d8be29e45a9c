"""`fab check-hosts` against real lab hosts: green when healthy, red (exit 1) with the reason;
a screen's worth without -v, every check's detail with it."""

from __future__ import annotations

import io
import re
import shutil

from rich.console import Console

from dflash_ops.core.inventory import load
from dflash_ops.evaluation.served import sglang_rows
from dflash_ops.remote import checks
from dflash_ops.remote.checks import Status
from dflash_ops.ui.console import check_summary


def table_row(output: str, check: str) -> str:
    """The (unfolded) table line of a check; the table is 200 columns wide in tests."""
    lines = [line for line in output.splitlines() if re.search(rf"│ {check}\s+│", line)]
    assert len(lines) == 1, f"{check!r} not found once in:\n{output}"
    return re.sub(r"\s+", " ", lines[0])


def test_healthy_lab_is_all_green(lab, fab):
    result = fab(lab.inventory_path, "check-hosts", "-v")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all required checks passed" in result.stdout
    assert "FAIL" not in result.stdout
    assert "✓ ok │ pct container 200: status: running" in table_row(result.stdout, "container")
    assert "no (transfers relay via the workstation)" in table_row(result.stdout, "reaches eval")
    assert "iB free)" in table_row(result.stdout, "target model")
    venv = table_row(result.stdout, "venv")  # not provisioned yet: a warning, not a failure
    assert "! warn" in venv and "created by `fab setup-eval-host`" in venv


def test_rows_carry_status_per_host(lab):
    rows = checks.check_inventory(load(lab.inventory_path))
    by_host = {(row.host, row.check): row.status for row in rows}
    for host in ("trainer", "eval"):
        for check in ("reachable", "host key", "authenticated"):
            assert by_host[(host, check)] is Status.OK
    assert by_host[("trainer", "tool pct")] is Status.OK
    assert not checks.failed(rows)


def test_stopped_sshd_is_red(make_lab, fab):
    built = make_lab()
    built.stop_sshd("eval")
    result = fab(built.inventory_path, "check-hosts", "-v")
    assert result.returncode == 1
    assert "required check(s) failed: eval reachable" in result.stderr
    eval_rows = result.stdout.split("│ eval ")[1]
    assert "✗ FAIL │ no SSH answer at" in table_row(eval_rows, "reachable")
    assert "- skipped │ host unreachable" in table_row(result.stdout, "remaining checks")


def test_wrong_known_hosts_entry_is_refused(make_lab, fab):
    built = make_lab()
    lines = built.known_hosts.read_text().splitlines()
    eval_address = lines[1].split(" ", 1)[0]
    lines[1] = f"{eval_address} {lines[0].split(' ', 1)[1]}"  # eval's address, trainer's key
    built.known_hosts.write_text("\n".join(lines) + "\n")
    result = fab(built.inventory_path, "check-hosts", "-v")
    assert result.returncode == 1
    assert "failed: eval host key" in result.stderr
    rows = checks.check_inventory(load(built.inventory_path))
    eval_rows = {row.check: row for row in rows if row.host == "eval"}
    assert eval_rows["host key"].status is Status.FAIL
    assert "does NOT match" in eval_rows["host key"].detail
    assert "authenticated" not in eval_rows  # no credentials were offered to it


def test_missing_directories_and_stopped_container_are_red(make_lab, fab):
    built = make_lab()
    target = load(built.inventory_path).hosts["eval"].target_model
    shutil.rmtree(target)
    built.set_container_running(False)
    result = fab(built.inventory_path, "check-hosts", "-v")
    assert result.returncode == 1
    assert "trainer container" in result.stderr and "eval target model" in result.stderr
    assert f"{target}: missing" in table_row(result.stdout, "target model")
    assert "status: stopped; start it first" in table_row(result.stdout, "container")
    built.set_container_running(True)
    shutil.rmtree(built.container_path("/workspace/checkpoints"))
    result = fab(built.inventory_path, "check-hosts", "-v")
    assert result.returncode == 1
    assert "missing; fix `checkpoints` in the inventory" in table_row(
        result.stdout, "checkpoints dir"
    )


def test_without_v_the_checks_fit_30_lines_at_80_columns_and_name_what_is_not_ok(lab, fab):
    rows = checks.check_inventory(load(lab.inventory_path), more=[sglang_rows])
    terminal = io.StringIO()
    Console(file=terminal, width=80, highlight=False, emoji=False).print(
        check_summary(rows, f"check-hosts ({lab.inventory_path})")
    )
    lines = terminal.getvalue().splitlines()
    assert len(lines) <= 30 and max(map(len, lines)) <= 80, terminal.getvalue()
    text = " ".join(terminal.getvalue().split())
    assert "✓ ok reachable, host key, authenticated, container," in text
    assert "! warn venv: " in text and "created by `fab setup-eval-host`" in text
    assert "machine" not in text  # the hosts' facts are -v's
    result = fab(lab.inventory_path, "check-hosts")
    assert result.returncode == 0, result.stderr
    assert "all required checks passed (details: -v)" in result.stdout
    assert "│" not in result.stdout and len(result.stdout.splitlines()) <= 30
