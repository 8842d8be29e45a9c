"""A staged path is replaced only when the tool put what is there: a file or directory of
the user's at `step_N/checkpoint.pt` (no manifest, no promote claim) stays, both before
anything is copied and in promote's own command. Real commands on the workstation's side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_ops.core.errors import NotOursError
from dflash_ops.staging.destination import Destination
from dflash_ops.staging.sides import LocalSide

MANIFEST = {"sha256": "b" * 64, "source_path": "/ckpt/step_4000/checkpoint.pt"}


def destination(tmp_path: Path, kind: str = "file") -> Destination:
    name = "checkpoint.pt" if kind == "file" else "checkpoint"
    step = tmp_path / "step_4000"
    step.mkdir(exist_ok=True)
    return Destination(LocalSide(), str(step / name), kind)


def verified_copy(dest: Destination, text: str = "new weights") -> None:
    """What the transfer leaves before promote: the verified partial."""
    partial = Path(dest.partial)
    if dest.is_set:
        partial.mkdir()
        (partial / "model.safetensors").write_text(text)
    else:
        partial.write_text(text)


def promote(dest: Destination):
    return dest.side.run(dest.promote_command(MANIFEST), check=False)


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_what_the_user_put_at_the_staged_path_is_refused_and_kept(tmp_path, kind):
    dest = destination(tmp_path, kind)
    users = Path(dest.path)
    if kind == "file":
        users.write_text("the user's own checkpoint")
    else:
        users.mkdir()
        (users / "notes.txt").write_text("the user's own notes")
    state = dest.state()
    assert not state.ours
    with pytest.raises(NotOursError, match="no staging manifest") as refused:
        dest.require_ours(state)
    assert dest.path in str(refused.value) and "workstation" in str(refused.value)
    verified_copy(dest)
    done = promote(dest)  # the command's own check, should the path change after the probe
    assert done.exit_code != 0 and "is not a copy dflash-ops staged" in done.stderr
    kept = users.read_text() if kind == "file" else (users / "notes.txt").read_text()
    assert kept.startswith("the user's own")
    assert not Path(dest.claim).exists() and not Path(dest.manifest).exists()


def test_a_symlink_the_user_put_there_is_left_too(tmp_path):
    dest = destination(tmp_path)
    target = tmp_path / "elsewhere.pt"
    target.write_text("kept")
    Path(dest.path).symlink_to(target)
    assert not dest.state().ours
    verified_copy(dest)
    assert promote(dest).exit_code != 0
    assert Path(dest.path).is_symlink() and target.read_text() == "kept"


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_copy_the_tool_staged_is_replaced_and_the_claim_is_gone_after(tmp_path, kind):
    dest = destination(tmp_path, kind)
    assert dest.state().ours  # nothing there
    verified_copy(dest, "first")
    assert promote(dest).exit_code == 0
    verified_copy(dest, "second")
    assert dest.state().ours  # the manifest says it is ours
    assert promote(dest).exit_code == 0
    found = Path(dest.path) / "model.safetensors" if dest.is_set else Path(dest.path)
    assert found.read_text() == "second"
    assert json.loads(Path(dest.manifest).read_text()) == MANIFEST
    assert not Path(dest.claim).exists() and not Path(f"{dest.path}.old").exists()


def test_a_crash_between_the_rename_and_the_manifest_leaves_a_copy_the_next_stage_replaces(
    tmp_path,
):
    dest = destination(tmp_path)
    verified_copy(dest, "first")
    crashed = dest.promote_command(MANIFEST).split(" && printf")[0]  # renamed, no manifest
    assert dest.side.run(crashed, check=False).exit_code == 0
    state = dest.state()
    assert state.manifest is None and state.final_size is not None and state.claimed
    assert state.ours
    verified_copy(dest, "again")
    assert promote(dest).exit_code == 0
    assert Path(dest.path).read_text() == "again" and not Path(dest.claim).exists()
