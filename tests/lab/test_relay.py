"""Failures of the relay on real lab hosts: interrupted transfers and resume, full disks,
corrupt partials, concurrent stages, a changing source and an unknown host key. Each must
give one clear error and lose nothing (or promote nothing that is not verified)."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
from pathlib import Path

import pytest

from dflash_ops.core.errors import DiskSpaceError, HostKeyError, NotOursError, TransferError
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.staging.delivery import StageOptions
from dflash_ops.staging.relay import RelayState
from dflash_ops.staging.stage import stage

SIZE = 8 << 20


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def staged_file(lab, step: int = 4000) -> Path:
    return lab.data_dir("eval") / "eval" / "checkpoints" / f"step_{step}" / "checkpoint.pt"


def partial_of(lab) -> Path:
    return staged_file(lab).with_name("checkpoint.pt.partial")


def at_fraction(fraction: float, action):
    """A progress callback that runs `action(state)` once, when `fraction` has been moved."""
    fired = []

    def callback(state: RelayState) -> None:
        if not fired and state.done >= fraction * state.total:
            fired.append(state.done)
            action(state)

    callback.fired = fired
    return callback


def kill_source(state: RelayState) -> None:
    os.killpg(state.source.pid, signal.SIGKILL)


def options(**kwargs) -> StageOptions:
    return StageOptions(report=lambda message: None, **kwargs)


@pytest.fixture
def small_lab(make_lab):
    lab = make_lab(steps=(4000,), checkpoint_size="8m")
    return lab, load_inventory(lab.inventory_path)


def logins(lab, host: str) -> int:
    """SSH logins the host's sshd accepted so far (its log, written by the real sshd)."""
    return (lab.host_dir(host) / "sshd.log").read_text().count("Accepted publickey")


def test_a_stage_logs_in_once_for_control_and_once_for_the_bytes_on_each_host(small_lab):
    """Every SSH handshake delays the transfer: the destination's state, its lock and its
    manifest share one control connection, and the bytes travel on one more."""
    lab, inventory = small_lab
    before = {host: logins(lab, host) for host in ("trainer", "eval")}
    (result,) = stage(inventory, 4000, options=options())
    assert result.moved == SIZE
    assert {host: logins(lab, host) - before[host] for host in before} == {
        "trainer": 2,
        "eval": 2,
    }


def test_killed_ssh_leaves_a_partial_that_resumes_and_verifies(small_lab):
    lab, inventory = small_lab
    with pytest.raises(TransferError, match="kept: rerun to resume"):
        stage(inventory, 4000, options=options(on_progress=at_fraction(0.5, kill_source)))
    assert not staged_file(lab).exists()
    kept = partial_of(lab).stat().st_size
    assert 0 < kept < SIZE
    assert lab.checkpoint_path(4000).read_bytes()[:kept] == partial_of(lab).read_bytes()

    (result,) = stage(inventory, 4000, options=options())
    assert result.moved == SIZE - kept  # only the missing bytes moved
    assert sha256(staged_file(lab)) == sha256(lab.checkpoint_path(4000)) == result.sha256
    assert not partial_of(lab).exists()


def test_ctrl_c_keeps_the_partial_and_no_resume_starts_over(small_lab):
    lab, inventory = small_lab

    def interrupt(state: RelayState) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stage(inventory, 4000, options=options(on_progress=at_fraction(0.5, interrupt)))
    assert partial_of(lab).exists() and not staged_file(lab).exists()
    (result,) = stage(inventory, 4000, options=options(resume=False))
    assert result.moved == SIZE
    assert sha256(staged_file(lab)) == sha256(lab.checkpoint_path(4000))


def test_destination_too_small_is_refused_before_writing(make_lab):
    lab = make_lab(steps=(4000,), checkpoint_size="16m", eval_disk="12m")
    inventory = load_inventory(lab.inventory_path)
    with pytest.raises(DiskSpaceError) as raised:
        stage(inventory, 4000, options=options())
    error = raised.value
    assert error.host == "eval" and error.needed > 16 << 20 and error.free <= 12 << 20
    assert "step_4000" in error.path and "need" in str(error)
    assert not staged_file(lab).parent.exists()


def test_disk_filled_by_another_writer_keeps_the_partial(make_lab):
    lab = make_lab(steps=(4000,), checkpoint_size="16m", eval_disk="24m")
    inventory = load_inventory(lab.inventory_path)
    filler = lab.data_dir("eval") / "filler"

    def fill_disk(state: RelayState) -> None:
        # Every free byte: the relay's bytes in flight race the filler for the last ones.
        with filler.open("wb", buffering=0) as out:
            try:
                while out.write(bytes(1 << 20)):
                    pass
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise

    with pytest.raises(TransferError, match="No space left on device") as raised:
        stage(inventory, 4000, options=options(on_progress=at_fraction(0.3, fill_disk)))
    assert "eval" in str(raised.value) and "checkpoint.pt.partial" in str(raised.value)
    assert not staged_file(lab).exists()
    kept = partial_of(lab).stat().st_size
    assert kept > 0
    filler.unlink()
    (result,) = stage(inventory, 4000, options=options())
    assert result.moved == (16 << 20) - kept
    assert sha256(staged_file(lab)) == sha256(lab.checkpoint_path(4000))


def test_a_flipped_byte_in_the_partial_is_detected_and_not_promoted(small_lab):
    lab, inventory = small_lab
    with pytest.raises(TransferError):
        stage(inventory, 4000, options=options(on_progress=at_fraction(0.5, kill_source)))
    with partial_of(lab).open("r+b") as partial:
        partial.seek(1000)
        byte = partial.read(1)
        partial.seek(1000)
        partial.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(TransferError, match="verification failed"):
        stage(inventory, 4000, options=options())
    assert not staged_file(lab).exists()
    assert not staged_file(lab).with_name("checkpoint.pt.manifest.json").exists()
    (result,) = stage(inventory, 4000, options=options())  # starts over: the partial went
    assert result.moved == SIZE
    assert sha256(staged_file(lab)) == sha256(lab.checkpoint_path(4000))


def test_a_concurrent_stage_of_the_same_file_is_refused(small_lab):
    lab, inventory = small_lab
    refusals: list[str] = []

    def second_stage(state: RelayState) -> None:
        with pytest.raises(TransferError) as raised:
            stage(inventory, 4000, options=options())
        refusals.append(str(raised.value))

    (result,) = stage(inventory, 4000, options=options(on_progress=at_fraction(0.5, second_stage)))
    (refusal,) = refusals
    assert "locked by another stage" in refusal and f"pid {os.getpid()}" in refusal
    assert result.moved == SIZE
    assert sha256(staged_file(lab)) == sha256(lab.checkpoint_path(4000))
    assert stage(inventory, 4000, options=options())[0].already  # the lock went with it


def test_a_file_of_the_users_at_the_staged_path_is_refused_before_any_byte_moves(small_lab):
    lab, inventory = small_lab
    users = staged_file(lab)
    users.parent.mkdir(parents=True, exist_ok=True)
    users.write_bytes(b"the user's own checkpoint")
    with pytest.raises(NotOursError, match="no staging manifest") as refused:
        stage(inventory, 4000, options=options())
    assert str(refused.value).startswith(f"eval: {users} is there with no staging manifest")
    assert users.read_bytes() == b"the user's own checkpoint"
    assert not partial_of(lab).exists()


def test_a_source_that_changes_during_the_transfer_is_not_promoted(small_lab):
    lab, inventory = small_lab

    def append(state: RelayState) -> None:
        with lab.checkpoint_path(4000).open("ab") as out:
            out.write(b"more")

    with pytest.raises(TransferError, match="changed during the transfer"):
        stage(inventory, 4000, options=options(on_progress=at_fraction(0.5, append)))
    assert not staged_file(lab).exists()


def test_unknown_host_key_is_refused(small_lab):
    lab, inventory = small_lab
    eval_address = lab.state.hosts["eval"].address
    lines = lab.known_hosts.read_text().splitlines()
    lab.known_hosts.write_text(
        "\n".join(line for line in lines if not line.startswith(eval_address)) + "\n"
    )
    with pytest.raises(HostKeyError, match="ssh-keyscan"):
        stage(inventory, 4000, options=options())
    assert not staged_file(lab).parent.exists()
