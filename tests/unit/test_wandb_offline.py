"""`--wandb PROJECT` (dflash_ops.evaluation.tracking), in W&B's offline mode only: nothing
contacts W&B. Each logged run's offline transaction log (`run-<id>.wandb`) is read back —
its LevelDB-style framing here, its records with wandb's own protobuf classes — and must
hold τ, the headline metrics and the training metrics keyed by the training step."""

from __future__ import annotations

import inspect
import math
import sys
from pathlib import Path

import pytest

import fabfile
from dflash_ops.core.errors import TrackerError
from dflash_ops.evaluation import results, tracking
from dflash_ops.evaluation.request import REQUEST_OPTIONS, request_options
from tests.training_samples import LOGGED, offline_runs, pull

wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed")


@pytest.fixture
def offline(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "wandb-files"
    directory.mkdir()
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B's own no-network mode
    monkeypatch.setenv("WANDB_DIR", str(directory))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return directory


def test_each_run_is_logged_at_its_training_step(tmp_path, offline, monkeypatch):
    root = tmp_path / "results"
    pull(root, 2000, 2.0, LOGGED[2000])
    pull(root, 4000, 3.0, LOGGED[4000])
    said: list[str] = []
    four, two = sorted(p.name for p in root.iterdir())[::-1]
    for run_id in (four, two):  # out of step order
        # a directory each: W&B names an offline run's directory by the second and the id
        monkeypatch.setenv("WANDB_DIR", str(offline / run_id))
        assert tracking.log_run("drafter-evals", root, run_id, said.append)
    wandb.teardown()  # its service writes the files behind the run's finish: until it ends
    logged = [offline_runs(offline / run_id)[0] for run_id in (four, two)]
    key = results.load_run(root / four).key_id  # both runs have it: one W&B run
    assert said == [
        f"W&B: step 4000 logged to drafter-evals (run dflash-eval-default-{key})",
        f"W&B: step 2000 logged to drafter-evals (run dflash-eval-default-{key})",
    ]
    (run_4000, at_4000), (_, at_2000) = logged
    assert (run_4000.project, run_4000.run_id) == ("drafter-evals", f"dflash-eval-default-{key}")
    assert at_4000["training_step"] == 4000 and at_2000["training_step"] == 2000
    assert (at_4000["eval/tau_macro"], at_2000["eval/tau_macro"]) == (3.0, 2.0)
    assert at_4000["eval/tau_pooled"] == 1.25 and at_4000["eval/tree_8"] == 1.75
    assert at_4000["eval/acc_1"] == 0.5 and at_4000["eval/best_tree"] == 1.75
    assert (at_4000["train/loss"], at_2000["train/loss"], at_2000["train/acc"]) == (1.75, 2.5, 0.25)
    assert math.isnan(at_4000["train/acc"])  # a non-finite training value stays visible
    assert at_4000["eval/run_id"] == four
    assert "step" not in {key.removeprefix("eval/") for key in at_4000}  # the step is the axis


def test_a_wandb_failure_is_one_line_and_the_results_stay(tmp_path, offline, monkeypatch):
    root = tmp_path / "results"
    pull(root, 2000, 2.0, None)
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setenv("WANDB_DIR", str(blocked))
    said: list[str] = []
    (run_id,) = [p.name for p in root.iterdir()]
    assert not tracking.log_run("drafter-evals", root, run_id, said.append)
    assert len(said) == 1 and said[0].startswith(f"W&B: run {run_id} not logged to drafter-evals")
    assert said[0].endswith("(the results are unaffected)")
    assert (root / run_id / "results.json").exists()


def test_a_bad_project_or_no_wandb_is_refused_before_anything_runs(monkeypatch):
    with pytest.raises(
        TrackerError, match=r"^--wandb: expected a W&B project name .* 'my project'"
    ):
        tracking.require_wandb("my project")
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the extra were not installed
    with pytest.raises(TrackerError, match=r"pip install 'dflash-ops\[wandb\]'"):
        tracking.require_wandb("drafter-evals")


@pytest.mark.parametrize("task", [fabfile.run_eval, fabfile.watch])
def test_run_eval_and_watch_take_the_request_options_with_one_help(task):
    """Workstation options the two tasks share (request.REQUEST_OPTIONS, --wandb among them):
    both take each and pass it to the request; --wandb is unset by default, with one help."""
    parameters = inspect.signature(task.body).parameters
    assert set(REQUEST_OPTIONS) <= set(parameters)
    assert parameters["wandb"].default is None
    assert task.help["wandb"] == fabfile.run_eval.help["wandb"]
    assert "Weights & Biases" in task.help["wandb"]
    assert request_options({"wandb": "p", "tag": None})["wandb"] == "p"
