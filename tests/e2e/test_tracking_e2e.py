"""End to end on a provisioned lab: a sweep with `--wandb` (W&B offline mode only) reads the
trainer's metrics log from its container when each run is pulled, compare shows the values
beside τ, and each step's W&B record holds τ and the training metrics at that step."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from dflash_lab.training_logs import LOG_DIR, logged_values, write_training_logs
from tests.conftest import run_fab
from tests.e2e.conftest import one_eval_host
from tests.training_samples import offline_runs

STEPS = (2000, 4000)
QUICK = ["--num-prompts", "1", "--max-new-tokens", "16"]


@pytest.fixture
def models_lab(e2e_lab, tmp_path):
    """The shared lab as a trainer and one eval host, its training logs removed afterwards
    (the shared lab is put back as built)."""
    yield one_eval_host(e2e_lab, tmp_path)
    shutil.rmtree(e2e_lab.container_path(LOG_DIR), ignore_errors=True)


def test_a_sweep_logs_tau_and_training_metrics_by_step(models_lab, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    sections = write_training_logs(models_lab, STEPS)
    document = yaml.safe_load(models_lab.inventory_path.read_text())
    document["hosts"]["trainer"]["metrics"] = sections["csv"]
    document["local"]["results"] = str(tmp_path / "results")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(document))
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B's no-network mode: nothing leaves
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-files"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)

    swept = run_fab(inventory, "run-eval", "--steps", "2000,4000", "--wandb", "e2e", *QUICK)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    logged_to = {
        step: re.findall(
            rf"W&B: step {step} logged to e2e \(run (dflash-eval-default-k\w+)\)", swept.stdout
        )
        for step in STEPS
    }
    (first,), (second,) = logged_to.values()
    assert first == second  # the steps of one training run and key: one W&B run
    assert "training metrics" not in swept.stdout  # both steps were in the log

    shown = run_fab(inventory, "compare", "--format", "json")
    runs = {run["step"]: run for run in json.loads(shown.stdout)["runs"]}
    history = {
        logged["training_step"]: logged
        for _, logged in offline_runs(tmp_path / "wandb-files")
        if "training_step" in logged
    }
    for step in STEPS:
        expected = logged_values(step)
        assert runs[step]["train.loss"] == expected["loss"]
        assert runs[step]["train.train_acc"] == expected["train_acc"]
        assert history[step]["train/loss"] == expected["loss"]
        assert history[step]["eval/tau_macro"] == runs[step]["tau_macro"]
