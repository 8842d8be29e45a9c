"""list-checkpoints and stage-checkpoint on real lab hosts: every access mode, the manifest,
idempotence, and the `fab` front door. Hash equality is checked here, on the lab's files."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest
import yaml

from dflash_ops.core.errors import CheckpointError
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.staging import catalog
from dflash_ops.staging.catalog import list_checkpoints
from dflash_ops.staging.delivery import StageOptions
from dflash_ops.staging.stage import stage


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def staged_file(lab, step: int, host: str = "eval") -> Path:
    return lab.data_dir(host) / "eval" / "checkpoints" / f"step_{step}" / "checkpoint.pt"


def quiet(**kwargs) -> StageOptions:
    messages: list[str] = []
    return StageOptions(report=messages.append, **kwargs)


def test_list_checkpoints_reports_steps_sizes_and_completeness(lab, inventory):
    found = list_checkpoints(inventory)
    assert [c.step for c in found] == [2000, 4000, 6000]
    for info in found:
        assert info.size == 4 << 20
        assert info.complete
        assert info.path == f"/workspace/checkpoints/step_{info.step}/checkpoint.pt"
        assert info.mtime == int(lab.checkpoint_path(info.step).stat().st_mtime)


def test_a_growing_file_is_not_complete(make_lab, monkeypatch):
    monkeypatch.setattr(catalog, "STABILITY", catalog.Stability())  # the real window
    lab = make_lab(steps=(2000,), checkpoint_size="1m")
    inventory = load_inventory(lab.inventory_path)
    growing = lab.checkpoint_path(2000)

    stop, writing = threading.Event(), threading.Event()

    def writer():
        # Appends until told to stop: the listing's two looks (the stability window apart) see
        # different sizes. The interval paces the writes (the trainer's disk is small); it
        # synchronises nothing: the test starts once the file is growing and stops it itself.
        with growing.open("ab") as out:
            while True:
                out.write(b"x" * 4096)
                out.flush()
                writing.set()
                if stop.wait(0.02):
                    return

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert writing.wait(30)
        (info,) = list_checkpoints(inventory)
        assert not info.complete
        with pytest.raises(CheckpointError, match="looks incomplete"):
            stage(inventory, 2000, options=quiet())
    finally:
        stop.set()
        thread.join()
    assert not staged_file(lab, 2000).exists()


def test_complete_marker_decides_completeness(make_lab):
    lab = make_lab(steps=(2000, 4000), checkpoint_size="1m")
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["hosts"]["trainer"]["complete_marker"] = "step_{step}/DONE"
    lab.inventory_path.write_text(yaml.safe_dump(document))
    (lab.checkpoint_path(4000).parent / "DONE").write_text("")
    found = list_checkpoints(load_inventory(lab.inventory_path))
    assert {c.step: c.complete for c in found} == {2000: False, 4000: True}


def test_missing_step_lists_the_available_ones(inventory):
    with pytest.raises(CheckpointError) as raised:
        stage(inventory, 4001, options=quiet())
    message = str(raised.value)
    assert "step 4001" in message and "2000, 4000, 6000" in message


def test_dry_run_plans_and_writes_nothing(lab, inventory):
    (staged,) = stage(inventory, 4000, options=quiet(dry_run=True))
    (hop,) = staged.plan
    assert hop.size == 4 << 20 and hop.offset == 0 and hop.space and hop.space.ok
    assert "4.0 MiB to move" in hop.describe()
    assert not staged_file(lab, 4000).parent.exists()


def test_pct_stream_stages_verifies_and_writes_a_manifest(make_lab):
    lab = make_lab(steps=(4000,))
    inventory = load_inventory(lab.inventory_path)
    (result,) = stage(inventory, 4000, options=quiet())
    target = staged_file(lab, 4000)
    source_sha = sha256(lab.checkpoint_path(4000))
    assert sha256(target) == source_sha == result.sha256
    assert result.path == str(target) and result.size == 4 << 20 and not result.already
    manifest = json.loads(target.with_name("checkpoint.pt.manifest.json").read_text())
    assert manifest["sha256"] == source_sha
    assert manifest["source_host"] == "trainer"
    assert manifest["source_path"] == "/workspace/checkpoints/step_4000/checkpoint.pt"
    assert manifest["size"] == 4 << 20 and manifest["step"] == 4000
    assert manifest["mtime"] == int(lab.checkpoint_path(4000).stat().st_mtime)
    assert not target.with_name("checkpoint.pt.partial").exists()

    mtime_before = target.stat().st_mtime_ns
    (again,) = stage(inventory, 4000, options=quiet())  # (how fast: benchmarks, not here)
    assert again.already and again.moved == 0 and again.sha256 == source_sha
    assert target.stat().st_mtime_ns == mtime_before

    (verified,) = stage(inventory, 4000, options=quiet(verify=True))
    assert verified.already and verified.sha256 == source_sha


def test_a_changed_source_is_staged_again(make_lab):
    lab = make_lab(steps=(4000,), checkpoint_size="1m")
    inventory = load_inventory(lab.inventory_path)
    stage(inventory, 4000, options=quiet())
    lab.checkpoint_path(4000).write_bytes(b"retrained" * 1000)
    (result,) = stage(inventory, 4000, options=quiet())
    assert not result.already
    assert sha256(staged_file(lab, 4000)) == sha256(lab.checkpoint_path(4000))


@pytest.mark.parametrize("via", ["pull", "rootfs"])
def test_pct_pull_and_rootfs_modes(make_lab, via):
    lab = make_lab(steps=(4000,))
    inventory = load_inventory(lab.inventory_path)
    (result,) = stage(inventory, 4000, options=quiet(via=via))
    assert sha256(staged_file(lab, 4000)) == sha256(lab.checkpoint_path(4000)) == result.sha256
    assert list((lab.data_dir("trainer") / "tmp").iterdir()) == []  # pull's copy removed


def test_pull_never_writes_through_a_planted_symlink(make_lab):
    """The copy out of the container goes to a fresh private directory: a symlink someone
    planted in the shared tmp_dir (at the name older versions used) is never followed."""
    lab = make_lab(steps=(4000,))
    inventory = load_inventory(lab.inventory_path)
    tmp = lab.data_dir("trainer") / "tmp"
    victim = lab.data_dir("trainer") / "victim"
    victim.write_bytes(b"precious")
    planted = tmp / "dflash-200-step_4000.pt"
    planted.symlink_to(victim)
    (result,) = stage(inventory, 4000, options=quiet(via="pull"))
    assert result.sha256 == sha256(lab.checkpoint_path(4000))
    assert victim.read_bytes() == b"precious"
    assert list(tmp.iterdir()) == [planted]  # the private directory is gone again


def test_pull_checks_the_trainer_temp_disk(make_lab):
    lab = make_lab(steps=(4000,), trainer_disk="24m", checkpoint_size="16m")
    inventory = load_inventory(lab.inventory_path)
    from dflash_ops.core.errors import DiskSpaceError

    with pytest.raises(DiskSpaceError, match="copy out of pct container 200") as raised:
        stage(inventory, 4000, options=quiet(via="pull"))
    assert raised.value.host == "trainer"
    assert not staged_file(lab, 4000).parent.exists()


def test_two_hop_fans_out_from_one_verified_local_copy(make_lab):
    lab = make_lab(steps=(4000,), eval_hosts=2)
    inventory = load_inventory(lab.inventory_path)
    results = stage(inventory, 4000, options=quiet(two_hop=True))
    assert [r.host for r in results] == ["workstation", "eval", "eval2"]
    local = lab.workstation_dir / "staging" / "step_4000" / "checkpoint.pt"
    source_sha = sha256(lab.checkpoint_path(4000))
    assert sha256(local) == source_sha
    assert sha256(staged_file(lab, 4000, "eval")) == source_sha
    assert sha256(staged_file(lab, 4000, "eval2")) == source_sha
    assert all(r.sha256 == source_sha and r.moved == 4 << 20 for r in results)
    # The eval hosts' manifests name the trainer's file, so a direct rerun sees them staged.
    assert all(r.already for r in stage(inventory, 4000, options=quiet()))


def test_paths_with_spaces_and_quotes(make_lab):
    lab = make_lab(steps=(4000,), checkpoint_size="1m")
    odd_dir = '/workspace/it\'s a "ckpt" dir'
    original = lab.checkpoint_path(4000)
    moved = lab.container_path(f"{odd_dir}/step 4000/ck pt's.pt")
    moved.parent.mkdir(parents=True)
    original.rename(moved)
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["hosts"]["trainer"]["checkpoints"] = odd_dir
    document["hosts"]["trainer"]["layout"] = "step {step}/ck pt's.pt"
    staging = lab.data_dir("eval") / 'stag\'ed "here" $HOME'
    document["hosts"]["eval"]["checkpoints"] = str(staging)
    lab.inventory_path.write_text(yaml.safe_dump(document))
    inventory = load_inventory(lab.inventory_path)
    assert [c.step for c in list_checkpoints(inventory)] == [4000]
    for via in ("stream", "rootfs"):
        (result,) = stage(inventory, 4000, options=quiet(via=via, resume=False))
        target = staging / "step_4000" / "checkpoint.pt"
        assert result.path == str(target)
        assert sha256(target) == sha256(moved)
        target.unlink()


def test_fab_stage_checkpoint_then_already_staged_then_listed(make_lab, fab):
    lab = make_lab(steps=(2000, 4000), checkpoint_size="2m")
    first = fab(lab.inventory_path, "stage-checkpoint", "--step", "4000")
    assert first.returncode == 0, first.stderr
    assert "staged and verified" in first.stdout
    assert sha256(staged_file(lab, 4000)) == sha256(lab.checkpoint_path(4000))
    second = fab(lab.inventory_path, "stage-checkpoint", "--step", "4000")
    assert second.returncode == 0 and "already staged" in second.stdout
    listed = fab(lab.inventory_path, "list-checkpoints", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["step"]: row for row in json.loads(listed.stdout)}
    assert rows[4000]["on_eval"] == "staged" and rows[2000]["on_eval"] is None
    assert rows[4000]["complete"] is True and rows[4000]["size_bytes"] == 2 * 2**20


def test_fab_missing_step_is_one_clear_error(lab, fab):
    result = fab(lab.inventory_path, "stage-checkpoint", "--step", "7")
    assert result.returncode == 1
    assert "available steps: 2000, 4000, 6000" in result.stderr
    assert "Traceback" not in result.stderr
