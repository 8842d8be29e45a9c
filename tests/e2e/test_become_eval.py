"""`become: sudo` on an eval host, end to end: the eval host logs in as the lab's non-root user
with passwordless sudo, and `fab setup-eval-host`, `fab run-eval`, `fab eval-status` and
`fab eval-logs` go through `sudo -n` there as they go on a root login.

What `become` promises (DESIGN.md, dflash_ops/remote/connection.py): every command on the
host runs as root, so everything the tool leaves there is root's, as with a root login, and
nothing is the login user's: no later step, with or without sudo, meets a file it did not
expect to own. Nothing is written to HOME either (a sudoers that keeps the login's HOME would
put root's files in the login's home), and the login's own home gets nothing at all. Without
`become`, the same login fails with one message that names the host and says to set
`become: sudo`.

One module lab (tiny target, one trained drafter step), provisioned once with the real
`fab setup-eval-host` through sudo: its venv comes from this machine's find-links, offline.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from dflash_lab import lab as labs
from dflash_ops.core.inventory import EvalHost
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from tests.conftest import run_fab

STEP = 2000
QUICK = ["--num-prompts", "2", "--max-new-tokens", "16", "--ddtree", "4"]

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("sudo") is None,
        reason="the lab makes a machine user for the sudo login (needs root) with sudo rights "
        "(needs the sudo package)",
    ),
    pytest.mark.long(95),  # seconds in a cold `make test` (5 workers)
]


@dataclass
class SudoEvalLab:
    lab: labs.Lab
    setup_output: str

    @property
    def inventory_path(self) -> Path:
        return self.lab.inventory_path

    @property
    def entry(self) -> EvalHost:
        return load_inventory(self.inventory_path).eval_hosts["eval"]

    @property
    def login(self) -> pwd.struct_passwd:
        assert self.lab.sudo_user is not None
        return pwd.getpwnam(self.lab.sudo_user)

    def remote(self, command: str) -> str:
        """`command`'s output on the eval host (through sudo, as the tool runs it)."""
        host = Host(load_inventory(self.inventory_path), "eval")
        try:
            return host.run(command).stdout
        finally:
            host.close()

    def stray_files(self) -> list[str]:
        """What a command run as the wrong user, or a root command writing to HOME, leaves:
        files of the login user on the eval disk; anything in the session's HOME (with a
        sudoers that keeps the login's HOME, those would be root's files in the login's
        home, which it could then not touch); root's files in the login's own home."""
        disk = self.lab.data_dir("eval")
        return [
            *_found(disk, "-user", str(self.login.pw_uid)),
            *_found(disk / "home", "-mindepth", "1"),
            *_found(self.login.pw_dir, "-user", "0"),
        ]


def _found(root: str | Path, *tests: str) -> list[str]:
    found = subprocess.run(["find", str(root), *tests], capture_output=True, text=True, check=True)
    return found.stdout.split()


@pytest.fixture(scope="module")
def sudo_eval(tmp_path_factory) -> Iterator[SudoEvalLab]:
    built = labs.up(
        labs.LabConfig(
            root=tmp_path_factory.mktemp("lab") / "lab",
            steps=(STEP,),
            eval_disk="3g",
            sudo_hosts=("eval",),
        ),
        labs.trained_models,
    )
    try:
        setup = run_fab(built.inventory_path, "setup-eval-host", timeout=600)
        assert setup.returncode == 0, setup.stdout + setup.stderr
        yield SudoEvalLab(built, setup.stdout)
    finally:
        assert not built.down()


def without_become(lab: labs.Lab, path: Path, venv_suffix: str = "") -> Path:
    """The lab's inventory with the eval host still logging in as the non-root user, but
    without `become` (and, with `venv_suffix`, asking for a venv not built yet: one to write).
    The lab lies in pytest's temporary directory, root's alone (0700): that login reaches
    nothing on the eval host's disk, as a non-root login reaches nothing under /root."""
    document = yaml.safe_load(lab.inventory_path.read_text())
    eval_host = document["hosts"]["eval"]
    eval_host.pop("become")
    eval_host["venv"]["path"] += venv_suffix
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_setup_through_sudo_builds_a_root_owned_venv_and_harness(sudo_eval):
    inventory = load_inventory(sudo_eval.inventory_path)
    assert inventory.eval_hosts["eval"].user == sudo_eval.login.pw_name != "root"
    assert "uv pushed from the workstation" in sudo_eval.setup_output
    # Imported by the venv's python, through sudo, before the record was written.
    assert "+cpu" in sudo_eval.setup_output and "CPU build" in sudo_eval.setup_output
    layout = EvalLayout(sudo_eval.entry)
    made = [layout.venv, layout.provision_record, layout.harness_current, f"{layout.uv_dir}/uv"]
    found = sudo_eval.remote(f"stat -L -c '%U %a' {' '.join(shlex.quote(p) for p in made)}")
    owners, modes = zip(*(line.split() for line in found.splitlines()), strict=True)
    assert owners == ("root",) * len(made)
    # Readable by every user of the host (SHARED_UMASK), as on a root login.
    assert modes == ("755", "644", "755", "755")
    assert sudo_eval.stray_files() == []


def test_a_second_setup_through_sudo_does_nothing(sudo_eval):
    venv = sudo_eval.entry.venv.path
    fingerprint = f"stat -c '%i %Y' {venv}/dflash-provision.json {venv}/bin/python"
    before = sudo_eval.remote(fingerprint)
    again = run_fab(sudo_eval.inventory_path, "setup-eval-host", timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "eval: nothing to do" in again.stdout
    assert "installing" not in again.stdout and "uploaded" not in again.stdout
    assert sudo_eval.remote(fingerprint) == before


def test_check_hosts_passes_on_the_provisioned_sudo_host(sudo_eval):
    done = run_fab(sudo_eval.inventory_path, "check-hosts", "-v")
    assert done.returncode == 0, done.stdout + done.stderr
    output = " ".join(done.stdout.split())
    assert "`sudo -n` works: commands run as root" in output
    assert "all required checks passed" in output


def test_run_eval_through_sudo_pulls_results_and_leaves_root_files(sudo_eval):
    done = run_fab(sudo_eval.inventory_path, "run-eval", "--step", str(STEP), *QUICK)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "succeeded (exit code 0)" in done.stdout
    results_dir = load_inventory(sudo_eval.inventory_path).local.results
    [run_file] = sorted(results_dir.glob("*/run.json"))
    run_id = run_file.parent.name
    results = json.loads((run_file.parent / "results.json").read_text())
    layout = EvalLayout(sudo_eval.entry)
    assert results["checkpoint"]["step"] == STEP
    assert results["checkpoint"]["path"] == layout.staged_checkpoint(STEP)
    assert results["metrics"]["tau_macro"] > 0
    # The staged checkpoint and the run's files are root's; the run directory is private.
    run_dir = layout.run(run_id)
    made = [
        layout.staged_checkpoint(STEP),
        run_dir,
        f"{run_dir}/results.json",
        f"{run_dir}/log",
        f"{run_dir}/exit_code",
    ]
    owners = sudo_eval.remote(f"stat -c '%U %a' {' '.join(shlex.quote(p) for p in made)}")
    assert [line.split()[0] for line in owners.splitlines()] == ["root"] * len(made)
    assert owners.splitlines()[1].split()[1] == "700"
    assert sudo_eval.stray_files() == []

    status = run_fab(sudo_eval.inventory_path, "eval-status")
    assert status.returncode == 0, status.stderr
    row = next(line for line in status.stdout.splitlines() if run_id in line)
    assert "succeeded" in row and "eval" in row and str(STEP) in row
    logs = run_fab(sudo_eval.inventory_path, "eval-logs", "--id", run_id)
    assert logs.returncode == 0, logs.stderr
    assert "Checkpoint" in logs.stdout  # the harness's summary, read from the root-only log
    followed = run_fab(sudo_eval.inventory_path, "eval-logs", "--id", run_id, "--follow")
    assert followed.returncode == 0, followed.stderr
    assert f"run {run_id} succeeded" in followed.stdout


def test_without_become_setup_and_run_eval_say_to_set_it(sudo_eval, tmp_path):
    user = sudo_eval.login.pw_name
    new_venv = without_become(sudo_eval.lab, tmp_path / "new-venv.yaml", "-without-become")
    plain = without_become(sudo_eval.lab, tmp_path / "plain.yaml")
    for inventory, task in (
        (new_venv, ["setup-eval-host"]),
        (plain, ["run-eval", "--step", str(STEP), *QUICK]),
    ):
        done = run_fab(inventory, *task)
        message = " ".join(done.stderr.split())
        assert done.returncode == 1, (task, done.stdout + done.stderr)
        assert "error: eval: " in message, (task, message)
        assert "Permission denied" in message, (task, message)
        assert f"The login user {user} is not root" in message, (task, message)
        assert "set `become: sudo` on hosts.eval" in message, (task, message)
        assert "Traceback" not in done.stderr
    # Runs there may be hidden from the login: not "no runs", but why and what to do.
    status = run_fab(plain, "eval-status")
    message = " ".join(status.stderr.split())
    assert status.returncode == 1, status.stdout + status.stderr
    assert f"eval: cannot list the runs in {EvalLayout(sudo_eval.entry).runs}" in message
    assert "Permission denied" in message and "set `become: sudo` on hosts.eval" in message
    assert sudo_eval.stray_files() == []
