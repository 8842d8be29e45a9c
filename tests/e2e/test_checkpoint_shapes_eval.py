"""A trainer's sharded Hugging Face directory, staged and evaluated by the harness on a
provisioned eval host (the other checkpoint shapes: tests/lab/test_checkpoint_shapes.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_lab import lab as labs
from dflash_ops.core.errors import TransferError
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.staging.stage import stage
from tests.lab.test_checkpoint_shapes import (
    DIRECTORY_LAYOUT,
    STEP,
    files_of,
    killed_at,
    options,
    set_trainer,
    source_dir,
    step_dir,
)

# --- a staged directory, evaluated ------------------------------------------------------------


pytestmark = pytest.mark.long(60)  # seconds in a cold `make test` (5 workers)


def resave_sharded(checkpoint: Path, directory: Path, shards: int = 2) -> None:
    """The trained drafter of a lab checkpoint as a trainer's HF directory: config.json, its
    parameters in `shards` safetensors files with their index, and the training state."""
    from dflash_eval.drafter.checkpoint import read_drafter
    from dflash_eval.drafter.torch_reader import TORCH_READER
    from safetensors.torch import save_file

    source = read_drafter(checkpoint, TORCH_READER)
    names = sorted(source.state_dict)
    directory.mkdir(parents=True)
    weight_map = {}
    for index in range(shards):
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: source.state_dict[name].contiguous() for name in names[index::shards]}
        save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    index_file = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index_file))
    (directory / "config.json").write_text(json.dumps(source.config_dict))
    (directory / "training_state.pt").write_bytes(checkpoint.read_bytes())


def sharded_models(lab, config) -> dict[str, dict]:
    """Lab content: the trained drafters, each step also as a sharded HF directory."""
    settings = labs.trained_models(lab, config)
    for step in config.steps:
        resave_sharded(lab.checkpoint_path(step), source_dir(lab, step))
    return settings


@pytest.fixture(scope="module")
def sharded_lab(tmp_path_factory) -> Iterator[labs.Lab]:
    """One lab for the module: the trainer's STEP a sharded directory (its layout), the eval
    host provisioned."""
    from dflash_ops.provision.setup import setup_eval_hosts

    root = tmp_path_factory.mktemp("lab") / "lab"
    built = labs.up(labs.LabConfig(root=root, steps=(STEP,), eval_disk="3g"), sharded_models)
    try:
        set_trainer(built, layout=DIRECTORY_LAYOUT)
        setup_eval_hosts(load_inventory(built.inventory_path), None, False, say=lambda _: None)
        yield built
    finally:
        assert not built.down()


@pytest.fixture
def lab(sharded_lab) -> Iterator[labs.Lab]:
    """The module's lab for one test; afterwards nothing staged or pulled (the next test
    stages STEP afresh)."""
    yield sharded_lab
    shutil.rmtree(step_dir(sharded_lab), ignore_errors=True)
    shutil.rmtree(sharded_lab.workstation_dir / "results", ignore_errors=True)


def test_a_sharded_directory_resumed_after_a_kill_is_evaluated_by_run_eval(lab, fab):
    inventory = load_inventory(lab.inventory_path)
    first_shard = source_dir(lab) / "model-00001-of-00002.safetensors"
    config = (source_dir(lab) / "config.json").stat().st_size
    kill = killed_at(config + first_shard.stat().st_size + 1)  # inside the second shard
    with pytest.raises(TransferError, match="kept: rerun to resume"):
        stage(inventory, STEP, options=options(on_progress=kill))

    resumed = fab(lab.inventory_path, "stage-checkpoint", "--step", str(STEP))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "staged and verified" in resumed.stdout
    staged = step_dir(lab) / "checkpoint"
    assert files_of(staged) == files_of(source_dir(lab))

    quick = ["--num-prompts", "2", "--max-new-tokens", "24", "--ddtree", "4"]
    run = fab(
        lab.inventory_path, "run-eval", "--step", str(STEP), "--reference", *quick, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "already staged" in run.stdout
    [results_file] = (lab.workstation_dir / "results").glob("*/results.json")
    results = json.loads(results_file.read_text())
    assert results["checkpoint"]["path"] == str(staged)  # the harness read the directory
    assert results["checkpoint"]["step"] == STEP
    # The lab's reference drafter is this step's weights, extracted from checkpoint.pt: the
    # sharded directory must evaluate to exactly the same acceptance.
    assert results["metrics"]["tau_macro"] == results["reference"]["metrics"]["tau_macro"]


def test_strip_optimizer_on_a_staged_directory_is_skipped_with_a_note(lab, fab):
    """A directory's optimizer files are never read by the harness: `--strip-optimizer` has
    nothing to strip there, says so in one line and evaluates the staged directory."""
    quick = ["--num-prompts", "1", "--max-new-tokens", "16", "--ddtree", "4"]
    run = fab(
        lab.inventory_path,
        "run-eval",
        "--step",
        str(STEP),
        "--strip-optimizer",
        *quick,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    staged = step_dir(lab) / "checkpoint"
    skipped = [line for line in run.stdout.splitlines() if "--strip-optimizer skipped" in line]
    assert len(skipped) == 1 and f"{staged} is a directory checkpoint" in skipped[0], run.stdout
    assert "optimizer state stripped" not in run.stdout
    assert not (step_dir(lab) / "extracted").exists()
    [results_file] = (lab.workstation_dir / "results").glob("*/results.json")
    results = json.loads(results_file.read_text())
    assert results["checkpoint"]["path"] == str(staged)
    assert json.loads((results_file.parent / "run.json").read_text())["problem"] is None
