"""run-eval never evaluates other bytes than staging verified (issue 11): a re-staged step is
extracted again, and a staged file corrupted on the eval host fails the run loudly."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from dflash_lab import lab as labs
from dflash_ops.core.inventory import load
from dflash_ops.provision.setup import setup_eval_hosts
from dflash_ops.remote.layout import EvalLayout
from tests.conftest import run_fab

QUICK = ["--num-prompts", "2", "--max-new-tokens", "24", "--ddtree", "4"]


@pytest.fixture(scope="module")
def models_lab(tmp_path_factory):
    built = labs.up(
        labs.LabConfig(root=tmp_path_factory.mktemp("lab") / "lab", steps=(2000, 4000, 6000)),
        labs.trained_models,
    )
    try:
        setup_eval_hosts(load(built.inventory_path), None, False, say=lambda message: None)
        yield built
    finally:
        assert not built.down()


def results_of(models_lab, output: str) -> dict:
    run_id = next(word for word in output.split() if "-step" in word and word.count("-") > 3)
    directory = load(models_lab.inventory_path).local.results / run_id
    return json.loads((directory / "results.json").read_text())


def strip_and_run(models_lab, step: int):
    return run_fab(
        models_lab.inventory_path, "run-eval", "--step", str(step), "--strip-optimizer", *QUICK
    )


def test_a_retrained_step_is_extracted_again_not_served_stale(models_lab):
    first = strip_and_run(models_lab, 6000)
    assert first.returncode == 0, first.stdout + first.stderr
    tau_6000 = results_of(models_lab, first.stdout)["metrics"]["tau_macro"]
    # Retrain and re-save step 6000 (here: the step-2000 weights under its name).
    trainer_file = models_lab.checkpoint_path(6000)
    shutil.copyfile(models_lab.checkpoint_path(2000), trainer_file)
    os.utime(trainer_file, (1_700_000_000, 1_700_000_000))
    second = strip_and_run(models_lab, 6000)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "extracting again" in second.stdout
    again = results_of(models_lab, second.stdout)
    reference = run_fab(models_lab.inventory_path, "run-eval", "--step", "2000", *QUICK)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    assert (
        again["metrics"]["tau_macro"]
        == results_of(models_lab, reference.stdout)["metrics"]["tau_macro"]
    )
    assert again["metrics"]["tau_macro"] != tau_6000
    third = strip_and_run(models_lab, 6000)
    assert third.returncode == 0 and "reusing" in third.stdout  # now current: reused


def test_a_staged_file_corrupted_on_the_eval_host_fails_the_run(models_lab):
    inventory_path = models_lab.inventory_path
    staged = run_fab(inventory_path, "stage-checkpoint", "--step", "4000")
    assert staged.returncode == 0, staged.stdout + staged.stderr
    entry = load(inventory_path).eval_hosts["eval"]
    local = EvalLayout(entry).staged_checkpoint(4000)  # the lab's hosts share this filesystem
    middle = os.path.getsize(local) // 2  # inside the tensor data: it still loads
    with open(local, "r+b") as file:  # flip a byte in place: same size, so "already staged"
        file.seek(middle)
        byte = file.read(1)
        file.seek(middle)
        file.write(bytes([byte[0] ^ 0x01]))
    result = run_fab(inventory_path, "run-eval", "--step", "4000", *QUICK)
    assert result.returncode == 1
    assert "the staged file changed or is corrupt" in result.stderr
    assert "--verify" in result.stderr
    compare = run_fab(inventory_path, "compare", "--steps", "4000")
    assert compare.returncode == 1 and "no successful runs to compare" in compare.stderr
    corrupt_stripped = strip_and_run(models_lab, 4000)
    assert corrupt_stripped.returncode == 1
    assert "does not hash to the sha256 staging verified" in corrupt_stripped.stderr
