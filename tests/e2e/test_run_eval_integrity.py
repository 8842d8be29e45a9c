"""run-eval never evaluates other bytes than staging verified (issue 11): a re-staged step is
extracted again, and a staged file corrupted on the eval host fails the run loudly."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from dflash_ops.core.inventory import load
from dflash_ops.remote.layout import EvalLayout
from tests.conftest import run_fab
from tests.e2e.conftest import one_eval_host

pytestmark = pytest.mark.long(200)  # seconds in a cold `make test` (5 workers)

QUICK = ["--num-prompts", "2", "--max-new-tokens", "24", "--ddtree", "4"]


@pytest.fixture
def models_lab(e2e_lab, tmp_path):
    """The shared lab as a trainer and one eval host."""
    return one_eval_host(e2e_lab, tmp_path)


def results_of(models_lab, output: str) -> dict:
    run_id = next(word for word in output.split() if "-step" in word and word.count("-") > 3)
    directory = load(models_lab.inventory_path).local.results / run_id
    return json.loads((directory / "results.json").read_text())


@contextmanager
def put_back(*paths: Path) -> Iterator[None]:
    """The module's lab is shared: files a test changes (a trainer checkpoint, a staged copy)
    are restored afterwards with their bytes and mtime, and checked, so no other test sees
    the change whatever the order."""
    kept = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in paths}
    try:
        yield
    finally:
        for path, (content, mtime) in kept.items():
            path.write_bytes(content)
            os.utime(path, ns=(mtime, mtime))
    for path, (content, mtime) in kept.items():
        assert path.read_bytes() == content and path.stat().st_mtime_ns == mtime, path


def strip_and_run(models_lab, step: int):
    return run_fab(
        models_lab.inventory_path, "run-eval", "--step", str(step), "--strip-optimizer", *QUICK
    )


def test_a_retrained_step_is_extracted_again_not_served_stale(models_lab):
    with put_back(models_lab.checkpoint_path(6000)):
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
    with put_back(Path(local)):
        middle = os.path.getsize(local) // 2  # inside the tensor data: it still loads
        with open(local, "r+b") as file:  # flip a byte in place: same size, so "already staged"
            file.seek(middle)
            byte = file.read(1)
            file.seek(middle)
            file.write(bytes([byte[0] ^ 0x01]))
        result = run_fab(inventory_path, "run-eval", "--step", "4000", *QUICK)
        assert result.returncode == 1
        assert "the staged checkpoint changed or is corrupt" in result.stderr
        assert "--verify" in result.stderr
        compare = run_fab(inventory_path, "compare", "--steps", "4000")
        assert compare.returncode == 1 and "no successful runs to compare" in compare.stderr
        corrupt_stripped = strip_and_run(models_lab, 4000)
        assert corrupt_stripped.returncode == 1
        assert "does not hash to the sha256 staging verified" in corrupt_stripped.stderr


def test_a_directory_of_the_users_where_the_extracted_copy_goes_is_left_alone(models_lab):
    entry = load(models_lab.inventory_path).eval_hosts["eval"]
    out = Path(EvalLayout.extracted(EvalLayout(entry).staged_checkpoint(4000)))
    aside = out.with_name(out.name + ".aside")
    if out.exists():  # the tool's own copy from another test: put back afterwards
        out.rename(aside)
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("kept")
    try:
        result = strip_and_run(models_lab, 4000)
        assert result.returncode == 1, result.stdout
        message = " ".join(result.stderr.split())
        assert f"eval: {out} is where the extracted checkpoint goes" in message
        assert "dflash-ops did not make it and changed nothing" in message
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    finally:
        shutil.rmtree(out)
        if aside.exists():
            aside.rename(out)


def _configless_checkpoint(models_lab, step: int, like: int) -> dict:
    """A training checkpoint as many training scripts save one: no config, and its `args` an
    argparse.Namespace (refused by weights_only=True unless allowed by name)."""
    import argparse

    import torch

    saved = torch.load(models_lab.checkpoint_path(like), weights_only=True)
    config = saved.pop("config")
    saved["args"] = argparse.Namespace(block_size=config["block_size"], lr=3e-4)
    saved["step"] = step
    target = models_lab.checkpoint_path(step)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(saved, target)
    return config


@pytest.fixture
def configless_step(models_lab):
    """Step 8000 on the trainer, a checkpoint without config; removed afterwards."""
    config = _configless_checkpoint(models_lab, 8000, like=6000)
    yield config
    shutil.rmtree(models_lab.checkpoint_path(8000).parent)


def test_a_checkpoint_that_needs_the_inventory_profile(models_lab, configless_step, tmp_path):
    config = configless_step
    bare = run_fab(models_lab.inventory_path, "run-eval", "--step", "8000", *QUICK)
    assert bare.returncode == 1
    assert "argparse.Namespace" in bare.stderr and "--safe-globals" in bare.stderr
    config_file = tmp_path / "drafter-config.json"
    config_file.write_text(json.dumps(config))
    document = yaml.safe_load(models_lab.inventory_path.read_text())
    document["hosts"]["trainer"]["drafter"] = {
        "name": "lab-v1",
        "config_file": str(config_file),
        "safe_globals": ["argparse"],
    }
    profiled = tmp_path / "inventory.yaml"
    profiled.write_text(yaml.safe_dump(document, sort_keys=False))
    result = run_fab(profiled, "run-eval", "--step", "8000", *QUICK)
    assert result.returncode == 0, result.stdout + result.stderr
    results = results_of(models_lab, result.stdout)
    assert results["drafter"]["profile"]["name"] == "lab-v1"
    assert results["drafter"]["provenance"]["target_layer_ids"] == "profile"
    assert results["checkpoint"]["pickle"]["safe_globals"] == ["argparse.Namespace"]
    same = run_fab(models_lab.inventory_path, "run-eval", "--step", "6000", *QUICK)
    assert same.returncode == 0, same.stdout + same.stderr
    assert results["metrics"] == results_of(models_lab, same.stdout)["metrics"]
    # The same checkpoint through run-eval's own flags, with the harness's names.
    flags = run_fab(
        models_lab.inventory_path,
        "run-eval",
        "--step",
        "8000",
        "--drafter-config",
        str(config_file),
        "--safe-globals",
        "argparse",
        *QUICK,
    )
    assert flags.returncode == 0, flags.stdout + flags.stderr
    assert results_of(models_lab, flags.stdout)["metrics"] == results["metrics"]


def test_run_eval_latest_through_a_pull(models_lab):
    result = run_fab(models_lab.inventory_path, "run-eval", "--latest", "--pull", *QUICK)
    assert result.returncode == 0, result.stdout + result.stderr
    assert results_of(models_lab, result.stdout)["checkpoint"]["step"] == 6000
    assert "copy out of" not in result.stderr
    bad = run_fab(models_lab.inventory_path, "run-eval", "--latest", "--via", "scp")
    assert bad.returncode == 1
    assert "--via: expected one of stream, pull, rootfs, found 'scp'" in bad.stderr
