"""`become: sudo`: a lab whose trainer and eval host log in as a non-root user with passwordless
sudo. Every command there — control commands, the relay's reader and writer, the held lock,
uploads — must run through `sudo -n`; without `become`, or without the sudo rule, the task
must fail with one line that says what to do.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from dflash_lab import lab as labs
from dflash_ops.core.errors import InventoryError, TransferError
from dflash_ops.core.inventory import Inventory, parse
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.remote.connection import Host
from dflash_ops.staging.delivery import StageOptions
from dflash_ops.staging.stage import stage
from tests.inventory_documents import minimal_document

STEP = 2000


def parsed(**trainer) -> Inventory:
    return parse(minimal_document(**trainer), Path("inv.yaml"))


def test_become_is_sudo_or_nothing():
    assert parsed().trainer.become is None
    assert parsed(user="ops", become="sudo").trainer.become == "sudo"
    with pytest.raises(InventoryError, match=r"hosts\.trainer\.become: expected 'sudo'"):
        parsed(become="su")


def test_only_a_become_host_wraps_its_commands_in_sudo_and_keeps_them_whole():
    command = "printf '%s' \"$HOME\" | wc -c; echo 'a b'"
    plain = Host(parsed(user="ops"), "trainer")
    assert plain.login_command(command) == f"umask 022; {command}"  # modes of our own
    wrapped = Host(parsed(user="ops", become="sudo"), "trainer").login_command(command)
    assert wrapped == f"sudo -n -- bash -c {shlex.quote(f'umask 022; {command}')}"
    assert shlex.split(wrapped)[-1] == f"umask 022; {command}"


def test_the_root_hint_speaks_only_to_a_non_root_login_without_become():
    assert "set `become: sudo` on hosts.trainer" in Host(parsed(user="ops"), "trainer").root_hint()
    assert Host(parsed(user="root"), "trainer").root_hint() == ""
    assert Host(parsed(user="ops", become="sudo"), "trainer").root_hint() == ""


# --- on a lab whose hosts log in as a non-root user with passwordless sudo --------------------

needs_root_and_sudo = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("sudo") is None,
    reason="the lab makes a machine user for the sudo login (needs root) with sudo rights "
    "(needs the sudo package)",
)


@pytest.fixture(scope="module")
def sudo_lab(tmp_path_factory):
    config = labs.LabConfig(
        root=tmp_path_factory.mktemp("lab") / "lab", steps=(STEP,), sudo_hosts=("trainer", "eval")
    )
    built = labs.up(config)
    # The checkpoints are root's alone, as on a trainer whose training runs as root.
    built.container_path("/workspace/checkpoints").chmod(0o700)
    yield built
    problems = built.down()
    assert not problems, problems
    assert built.sudo_user is not None
    with pytest.raises(KeyError):
        pwd.getpwnam(built.sudo_user)


def without_become(lab: labs.Lab, tmp_path: Path) -> Path:
    """The lab's inventory, each host still logging in as the non-root user, without sudo."""
    document = yaml.safe_load(lab.inventory_path.read_text())
    for host in document["hosts"].values():
        host.pop("become", None)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@needs_root_and_sudo
def test_the_lab_logs_in_as_a_non_root_user_whose_commands_run_as_root(sudo_lab):
    inventory = load_inventory(sudo_lab.inventory_path)
    host = Host(inventory, "trainer")
    try:
        assert inventory.trainer.user == sudo_lab.sudo_user != "root"
        assert host.run("id -un", as_login_user=True).stdout.strip() == sudo_lab.sudo_user
        assert host.run("id -un").stdout.strip() == "root"
        # The command reaches bash under sudo exactly as written: quotes, $, ;, newlines.
        odd = "printf '%s|' \"a b\" '$HOME' 'x;y' \"$(echo 'c\nd')\""
        assert host.run(odd).stdout == "a b|$HOME|x;y|c\nd|"
    finally:
        host.close()


@needs_root_and_sudo
def test_stage_reads_a_root_only_checkpoint_dir_and_writes_as_root_with_become(sudo_lab, fab):
    done = fab(sudo_lab.inventory_path, "stage-checkpoint", "--step", str(STEP))
    assert done.returncode == 0, done.stdout + done.stderr
    staged = sudo_lab.data_dir("eval") / "eval" / "checkpoints" / f"step_{STEP}"
    copy = staged / "checkpoint.pt"
    assert copy.read_bytes() == sudo_lab.checkpoint_path(STEP).read_bytes()
    assert (copy.stat().st_uid, copy.with_suffix(".pt.manifest.json").stat().st_uid) == (0, 0)
    again = fab(sudo_lab.inventory_path, "stage-checkpoint", "--step", str(STEP))
    assert again.returncode == 0 and "already staged" in again.stdout


@needs_root_and_sudo
def test_without_become_the_stage_fails_saying_to_set_it(sudo_lab, fab, tmp_path):
    done = fab(without_become(sudo_lab, tmp_path), "stage-checkpoint", "--step", str(STEP))
    assert done.returncode == 1
    message = " ".join(done.stderr.split())
    assert f"The login user {sudo_lab.sudo_user} is not root" in message
    assert "set `become: sudo` on hosts.trainer" in message
    assert "Traceback" not in done.stderr


@needs_root_and_sudo
def test_a_write_denied_to_a_login_without_become_says_so_not_rerun(sudo_lab, tmp_path):
    """The eval login reaches its staging dir but not a partial root left there (a root stage
    was interrupted): a rerun would fail the same way, so the error says what will help."""
    document = yaml.safe_load(sudo_lab.inventory_path.read_text())
    document["hosts"]["eval"].pop("become")
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(document))
    inventory = load_inventory(tmp_path / "inventory.yaml")
    step_dir = sudo_lab.data_dir("eval") / "eval" / "checkpoints" / f"step_{STEP}"
    aside = step_dir.with_name("aside")
    login = pwd.getpwnam(sudo_lab.sudo_user)
    step_dir.parent.mkdir(parents=True, exist_ok=True)  # as a stage as root would have
    ancestors = [d for d in step_dir.parents if d != Path("/")]
    modes = {d: d.stat().st_mode for d in ancestors}
    if step_dir.exists():
        step_dir.rename(aside)
    try:
        for directory in ancestors:
            directory.chmod(modes[directory] | stat.S_IXOTH)
        step_dir.mkdir()
        os.chown(step_dir, login.pw_uid, login.pw_gid)
        partial = step_dir / "checkpoint.pt.partial"
        partial.write_bytes(sudo_lab.checkpoint_path(STEP).read_bytes()[: 1 << 20])  # root's
        with pytest.raises(TransferError) as failed:
            stage(inventory, STEP, options=StageOptions(report=lambda _: None))
        message = " ".join(str(failed.value).split())
        assert f"writing {partial}" in message and "Permission denied" in message, message
        assert "A rerun cannot write there either" in message, message
        assert "set `become: sudo` on hosts.eval" in message, message
        assert "rerun to resume" not in message, message
        assert partial.stat().st_size == 1 << 20  # what was there is kept
    finally:
        shutil.rmtree(step_dir, ignore_errors=True)
        if aside.exists():
            aside.rename(step_dir)
        for directory in ancestors:
            directory.chmod(stat.S_IMODE(modes[directory]))


@needs_root_and_sudo
def test_check_hosts_warns_that_pct_needs_root_without_become(sudo_lab, fab, tmp_path):
    done = fab(without_become(sudo_lab, tmp_path), "check-hosts", "-v")
    output = " ".join(done.stdout.split())
    assert "root for pct" in output and "set `become: sudo`" in output


@needs_root_and_sudo
def test_check_hosts_reports_missing_sudo_rights_and_the_rule_to_add(sudo_lab, fab):
    sudo_lab.set_sudo_rights(False)
    try:
        done = fab(sudo_lab.inventory_path, "check-hosts", "-v")
        staged = fab(sudo_lab.inventory_path, "stage-checkpoint", "--step", str(STEP))
    finally:
        sudo_lab.set_sudo_rights(True)
    assert done.returncode == 1
    output = " ".join(done.stdout.split())
    assert "sudo │ ✗ FAIL" in output
    assert "a password is required" in output
    assert f"'{sudo_lab.sudo_user} ALL=(root) NOPASSWD: ALL'" in output
    assert "required check(s) failed: trainer sudo; eval sudo" in done.stderr
    assert staged.returncode == 1
    assert "`become: sudo` needs passwordless sudo" in staged.stderr
    assert "Traceback" not in staged.stderr


@needs_root_and_sudo
def test_an_upload_under_become_is_written_by_root(sudo_lab):
    inventory = load_inventory(sudo_lab.inventory_path)
    root_only = sudo_lab.data_dir("eval") / "root-only"
    root_only.mkdir(mode=0o700)
    host = Host(inventory, "eval")
    try:
        host.upload(b"settings\n", f"{root_only}/run.json", private=True)
        written = root_only / "run.json"
        assert written.read_bytes() == b"settings\n"
        assert (written.stat().st_uid, written.stat().st_mode & 0o777) == (0, 0o600)
    finally:
        host.close()
        shutil.rmtree(root_only)


@needs_root_and_sudo
def test_a_download_under_become_reads_a_root_only_file_and_says_when_it_is_missing(sudo_lab):
    """What fetch-results pulls from a run directory the login user may not read."""
    inventory = load_inventory(sudo_lab.inventory_path)
    root_only = sudo_lab.data_dir("eval") / "root-only-results"
    root_only.mkdir(mode=0o700)
    payload = bytes(range(256)) * 64  # binary, with every byte value
    (root_only / "results.json").write_bytes(payload)
    host = Host(inventory, "eval")
    try:
        assert host.download(f"{root_only}/results.json") == payload
        assert host.download(f"{root_only}/absent.json") is None
    finally:
        host.close()
        shutil.rmtree(root_only)
