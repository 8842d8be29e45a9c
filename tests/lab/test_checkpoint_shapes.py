"""Every checkpoint shape on real lab hosts: a Hugging Face directory with sharded safetensors
staged as one unit (per-file verification and resume, promoted only whole), a directory that
changes while it is copied, and --weights-only: a directory's weight files, or the drafter
weights extracted on the trainer from a training checkpoint whose optimizer state is
realistic (AdamW moments: twice the weights) — or the whole file, with the reason, when the
training environment has no torch.

The directories are built here from the lab's own content (random bytes, or the lab's tiny
trained drafter resaved as shards), so the lab itself needs no new content kind."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from dflash_lab import lab as labs
from dflash_ops.core.errors import TransferError
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.staging.catalog import list_checkpoints
from dflash_ops.staging.delivery import StageOptions
from dflash_ops.staging.destination import staged_status
from dflash_ops.staging.relay import RelayState
from dflash_ops.staging.stage import stage

pytestmark = pytest.mark.long(60)  # seconds in a cold `make test` (5 workers)

STEP = 4000
SHARDS = 3
SHARD = 2 << 20
DIRECTORY_LAYOUT = "checkpoint-{step}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def options(notes: list[str] | None = None, **kwargs) -> StageOptions:
    return StageOptions(report=(notes.append if notes is not None else lambda _: None), **kwargs)


def source_dir(lab, step: int = STEP) -> Path:
    return lab.container_path(f"{labs.CONTAINER_CHECKPOINTS}/checkpoint-{step}")


def step_dir(lab, step: int = STEP, host: str = "eval") -> Path:
    return lab.data_dir(host) / "eval" / "checkpoints" / f"step_{step}"


def write_hf_directory(directory: Path, shards: int = SHARDS, shard_size: int = SHARD) -> None:
    """Random bytes laid out as a trainer's per-step HF directory: sharded safetensors with
    their index, config.json, and optimizer state twice the weights' size."""
    directory.mkdir(parents=True)
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for name in names:
        (directory / name).write_bytes(os.urandom(shard_size))
    index = {"metadata": {"total_size": shards * shard_size}, "weight_map": {"w": names[0]}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "config.json").write_text(json.dumps({"hidden_size": 64}))
    (directory / "optimizer.pt").write_bytes(os.urandom(2 * shards * shard_size))


def directory_checkpoints(lab, config) -> dict[str, dict]:
    """Lab content: every step a directory (next to the default tiny checkpoint files)."""
    settings = labs.random_checkpoints(lab, config)
    for step in config.steps:
        write_hf_directory(source_dir(lab, step))
    return settings


def set_trainer(lab, **settings) -> None:
    """Change the trainer's inventory entry (e.g. its layout) as a user would."""
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["hosts"]["trainer"].update(settings)
    lab.inventory_path.write_text(yaml.safe_dump(document, sort_keys=False))


@pytest.fixture
def directory_lab(make_lab):
    lab = make_lab(directory_checkpoints, steps=(STEP,), checkpoint_size="1k")
    set_trainer(lab, layout=DIRECTORY_LAYOUT)
    return lab, load_inventory(lab.inventory_path)


def killed_at(total_bytes: int):
    """A progress callback killing the source once `total_bytes` of the set have moved."""

    def callback(state: RelayState) -> None:
        if state.done >= total_bytes and not callback.fired:
            callback.fired = True
            os.killpg(state.source.pid, signal.SIGKILL)

    callback.fired = False
    return callback


def files_of(directory: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(directory.iterdir())}


# --- directories ----------------------------------------------------------------------------


def test_a_sharded_directory_is_listed_with_its_total_size(directory_lab):
    lab, inventory = directory_lab
    (info,) = list_checkpoints(inventory)
    total = sum(p.stat().st_size for p in source_dir(lab).iterdir())
    assert info.path == f"{labs.CONTAINER_CHECKPOINTS}/checkpoint-{STEP}"
    assert info.directory and info.size == total and info.complete
    assert sorted(m.name for m in info.members) == sorted(p.name for p in source_dir(lab).iterdir())


def test_a_sharded_directory_resumes_after_a_kill_mid_set_and_is_promoted_whole(directory_lab):
    lab, inventory = directory_lab
    source = source_dir(lab)
    total = sum(p.stat().st_size for p in source.iterdir())
    config = (source / "config.json").stat().st_size
    kill = killed_at(config + SHARD + SHARD // 2)  # half-way through the second shard
    with pytest.raises(TransferError, match="kept: rerun to resume"):
        stage(inventory, STEP, options=options(on_progress=kill))
    final, partial = step_dir(lab) / "checkpoint", step_dir(lab) / "checkpoint.partial"
    assert not final.exists() and not (step_dir(lab) / "checkpoint.manifest.json").exists()
    # The files that verified kept their names; the one cut short is still a partial.
    verified = {"config.json", "model-00001-of-00003.safetensors"}
    assert verified <= {p.name for p in partial.iterdir()}
    cut = partial / "model-00002-of-00003.safetensors.partial"
    assert 0 < cut.stat().st_size < SHARD
    kept = sum(p.stat().st_size for p in partial.iterdir())
    assert list_checkpoints(inventory)[0].size == total
    assert staged_status(inventory, "eval", list_checkpoints(inventory))[STEP].startswith("partial")

    (result,) = stage(inventory, STEP, options=options())
    assert result.kind == "directory" and result.path == str(final)
    assert result.moved == total - kept  # only what was missing moved
    assert files_of(final) == files_of(source)
    assert not partial.exists() and not Path(f"{partial}.jsonl").exists()
    manifest = json.loads((step_dir(lab) / "checkpoint.manifest.json").read_text())
    assert manifest["kind"] == "directory" and manifest["sha256"] == result.sha256
    assert {f["name"]: f["sha256"] for f in manifest["files"]} == files_of(source)
    assert staged_status(inventory, "eval", list_checkpoints(inventory))[STEP] == "staged"
    assert stage(inventory, STEP, options=options())[0].already


def test_a_directory_that_changes_mid_copy_is_not_promoted(directory_lab):
    lab, inventory = directory_lab
    source = source_dir(lab)
    first_shard = source / "model-00001-of-00003.safetensors"

    def trainer_rewrites_a_copied_shard(state: RelayState) -> None:
        if state.done >= state.total // 2 and not trainer_rewrites_a_copied_shard.done:
            trainer_rewrites_a_copied_shard.done = True
            with first_shard.open("ab") as out:
                out.write(b"one more step")

    trainer_rewrites_a_copied_shard.done = False
    with pytest.raises(TransferError, match="changed during the transfer") as raised:
        stage(inventory, STEP, options=options(on_progress=trainer_rewrites_a_copied_shard))
    assert "model-00001-of-00003.safetensors" in str(raised.value)
    assert not (step_dir(lab) / "checkpoint").exists()
    assert not (step_dir(lab) / "checkpoint.manifest.json").exists()

    (result,) = stage(inventory, STEP, options=options())  # the trainer has finished now
    assert files_of(step_dir(lab) / "checkpoint") == files_of(source)
    assert result.moved < result.size  # the files that had verified were not sent again


def test_two_hop_fans_a_directory_out_from_its_verified_local_copy(make_lab):
    lab = make_lab(directory_checkpoints, steps=(STEP,), checkpoint_size="1k", eval_hosts=2)
    set_trainer(lab, layout=DIRECTORY_LAYOUT)
    inventory = load_inventory(lab.inventory_path)
    results = stage(inventory, STEP, options=options(two_hop=True))
    assert [r.host for r in results] == ["workstation", "eval", "eval2"]
    expected = files_of(source_dir(lab))
    assert files_of(lab.workstation_dir / "staging" / f"step_{STEP}" / "checkpoint") == expected
    for host in ("eval", "eval2"):
        assert files_of(step_dir(lab, host=host) / "checkpoint") == expected
    assert len({r.sha256 for r in results}) == 1
    assert all(r.already for r in stage(inventory, STEP, options=options()))


def test_weights_only_of_a_directory_leaves_the_optimizer_state_behind(directory_lab, fab):
    lab, inventory = directory_lab
    (result,) = stage(inventory, STEP, options=options(weights_only=True))
    staged = step_dir(lab) / "extracted"
    assert result.kind == "extracted" and result.path == str(staged)
    assert sorted(p.name for p in staged.iterdir()) == [
        "config.json",
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
    ]
    optimizer = (source_dir(lab) / "optimizer.pt").stat().st_size
    assert result.moved == result.size == result.source_size - optimizer
    assert staged_status(inventory, "eval", list_checkpoints(inventory))[STEP] == "weights"
    again = fab(lab.inventory_path, "stage-checkpoint", "--step", str(STEP), "--weights-only")
    assert again.returncode == 0, again.stderr
    assert "already staged" in again.stdout and "66% not moved" in again.stdout


def test_weights_only_through_the_workstation_copy(directory_lab):
    lab, inventory = directory_lab
    workstation, on_eval = stage(inventory, STEP, options=options(two_hop=True, weights_only=True))
    assert workstation.host == "workstation" and on_eval.host == "eval"
    local = lab.workstation_dir / "staging" / f"step_{STEP}" / "extracted"
    assert files_of(local) == files_of(step_dir(lab) / "extracted")
    assert "optimizer.pt" not in files_of(local)
    assert workstation.sha256 == on_eval.sha256 and on_eval.kind == "extracted"


# --- weights only from a training checkpoint ------------------------------------------------


@pytest.fixture
def models_lab(make_lab):
    """Trained drafter checkpoints (model_state_dict + AdamW moments + config + args)."""
    lab = make_lab(labs.trained_models, steps=(STEP,), eval_disk="512m")
    return lab, load_inventory(lab.inventory_path)


def test_weights_only_without_torch_on_the_trainer_stages_the_whole_file(models_lab):
    lab, inventory = models_lab
    (plan,) = stage(inventory, STEP, options=options(weights_only=True, dry_run=True))
    assert plan.plan[0].size == lab.checkpoint_path(STEP).stat().st_size  # an upper bound
    notes: list[str] = []
    (result,) = stage(inventory, STEP, options=options(notes, weights_only=True))
    assert any("cannot extract" in n and "No module named 'torch'" in n for n in notes), notes
    assert any("--strip-optimizer" in n for n in notes)
    assert result.kind == "file" and result.moved == lab.checkpoint_path(STEP).stat().st_size
    assert result.sha256 == sha256(lab.checkpoint_path(STEP))


@contextmanager
def this_python_in_the_container(lab):
    """Give the lab's trainer container a training environment: this interpreter and its
    venv (with torch and safetensors), bind-mounted read-only at the same paths, as a
    training image ships its own. The mounts are made in the trainer sshd's own mount
    namespace (where its sessions, and so `pct exec`, see them), and removed at the end;
    should that fail, they go with the namespace when the lab stops its sshd."""
    enter = ["nsenter", "-t", str(lab.state.hosts["trainer"].pid), "-m", "--"]
    mounted = []
    try:
        for prefix in sorted({Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}):
            target = lab.container_rootfs / prefix.relative_to("/")
            target.mkdir(parents=True, exist_ok=True)
            subprocess.run([*enter, "mount", "-o", "bind,ro", prefix, target], check=True)
            mounted.append(target)
        yield f"{sys.prefix}/bin/python"
    finally:
        for target in reversed(mounted):
            subprocess.run([*enter, "umount", target], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts into the container need root")
def test_weights_only_extracts_on_the_trainer_and_moves_only_the_weights(models_lab, tmp_path):
    lab, _ = models_lab
    checkpoint = lab.checkpoint_path(STEP)
    with this_python_in_the_container(lab) as python:
        set_trainer(lab, python=python)
        inventory = load_inventory(lab.inventory_path)
        notes: list[str] = []
        (result,) = stage(inventory, STEP, options=options(notes, weights_only=True))
        assert not list((lab.container_rootfs / "tmp").glob("dflash-strip.*"))  # cleaned up
        (again,) = stage(inventory, STEP, options=options(weights_only=True))
    size = checkpoint.stat().st_size
    assert result.kind == "extracted", notes  # else the notes say why it could not extract
    assert result.source_size == size
    assert result.moved == result.size < size // 2  # the AdamW moments stayed behind
    assert any("drafter weights extracted" in n for n in notes), notes
    assert again.already and again.moved == 0

    staged = Path(result.path)
    assert staged == step_dir(lab) / "extracted"
    manifest = json.loads((step_dir(lab) / "extracted.manifest.json").read_text())
    assert manifest["source_sha256"] == sha256(checkpoint)  # the source, linked to …
    assert {f["name"]: f["sha256"] for f in manifest["files"]} == files_of(staged)  # … its copy
    assert manifest["source_size"] == size and manifest["step"] == STEP

    # The same weights, config and hints as the harness's own (eval-side) extraction.
    from dflash_eval.drafter.checkpoint import read_drafter
    from dflash_eval.drafter.torch_reader import TORCH_READER
    from dflash_eval.run.extract import extract

    extract(checkpoint, tmp_path / "eval-side")
    ours = read_drafter(staged, TORCH_READER)
    theirs = read_drafter(tmp_path / "eval-side", TORCH_READER)
    assert ours.kind == theirs.kind == "extracted"
    assert ours.state_dict.keys() == theirs.state_dict.keys()
    assert all(ours.state_dict[k].equal(theirs.state_dict[k]) for k in ours.state_dict)
    assert (ours.config_dict, ours.step, ours.extra_hints) == (
        theirs.config_dict,
        theirs.step,
        theirs.extra_hints,
    )
