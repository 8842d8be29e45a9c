"""Fabric's and Invoke's own flags (-R, -H, -i, -S, -t …) would be silently ignored by tasks
that connect through the inventory: each is refused before the task does anything."""

from __future__ import annotations

import pytest


def test_fabric_dry_run_flag_is_refused_and_nothing_is_copied(make_lab, fab):
    lab = make_lab(steps=(4000,), checkpoint_size="1m")
    result = fab(lab.inventory_path, "-R", "stage-checkpoint", "--step", "4000")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "does not honour Fabric's own flags: -R/--dry: use the task's own --dry-run" in (
        " ".join(result.stderr.split())
    )
    assert not (lab.data_dir("eval") / "eval" / "checkpoints" / "step_4000").exists()
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("flags", "advice"),
    [
        (["-H", "somewhere"], "-H/--hosts: hosts come from the inventory"),
        (["-i", "/nonexistent/key"], "-i/--identity: set identity_file"),
        (["-S", "/dev/null"], "-S/--ssh-config: set ssh_config"),
        (["-t", "5"], "-t/--connect-timeout: set connect_timeout"),
        (["-e", "-w"], "-e/--echo: commands are not echoed by these tasks; -w/--warn-only"),
    ],
)
def test_other_core_flags_are_refused_naming_what_to_use(lab, fab, flags, advice):
    result = fab(lab.inventory_path, *flags, "list-checkpoints")
    assert result.returncode == 1, result.stdout + result.stderr
    assert advice in " ".join(result.stderr.split())
    assert result.stdout == ""  # refused before anything was listed


def test_plain_invocation_still_runs(lab, fab):
    result = fab(lab.inventory_path, "list-checkpoints")
    assert result.returncode == 0, result.stderr
