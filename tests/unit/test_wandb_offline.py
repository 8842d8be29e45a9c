"""`--wandb PROJECT` (dflash_ops.evaluation.tracking), in W&B's offline mode only: nothing
contacts W&B. Each logged run's offline transaction log (`run-<id>.wandb`) is read back —
its LevelDB-style framing here, its records with wandb's own protobuf classes — and must
hold τ, the headline metrics and the training metrics keyed by the training step, in one W&B
run per training run and comparability key; `fab wandb-sync` sends what was pulled, once."""

from __future__ import annotations

import inspect
import json
import math
import sys
from pathlib import Path

import pytest
import yaml
from dflash_eval.contract import reading

import fabfile
from dflash_ops.core.errors import TrackerError
from dflash_ops.evaluation import results, tracking
from dflash_ops.evaluation.request import REQUEST_OPTIONS, request_options
from tests.conftest import REPO, run_fab
from tests.schema_samples import pulled
from tests.training_samples import LOGGED, offline_runs, pull
from tests.unit.test_comparability_key import pull as pull_with_intervals

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


@pytest.fixture
def blocked(tmp_path, offline, monkeypatch) -> Path:
    """A results directory with one pulled run, and W&B's directory a file: W&B fails."""
    root = tmp_path / "results"
    pull(root, 2000, 2.0, None)
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setenv("WANDB_DIR", str(blocked))
    return root


def test_a_wandb_failure_is_one_line_and_the_results_stay(blocked):
    root = blocked
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
    assert request_options({}, {"wandb": "p", "tag": None})["wandb"] == "p"


def test_runs_that_may_not_be_compared_go_to_w_and_b_runs_of_their_own(tmp_path, offline):
    """One W&B run per training run and comparability key: a 96-token and a 256-token
    evaluation of one training run never share a curve; τ of each prompt set is logged
    with its interval."""
    root = tmp_path / "results"
    pull_with_intervals(root, "short-4000", 4000, 1.85, prompts={"max_new_tokens": 96})
    pull_with_intervals(root, "long-4000", 4000, 3.2, prompts={"max_new_tokens": 256})
    said: list[str] = []
    rows = {row.run_id: row for row in results.load_runs(root)}
    for run_id in ("short-4000", "long-4000"):
        assert tracking.log_run("drafter-evals", root, run_id, said.append)
    wandb.teardown()
    logged = {run.run_id: history for run, history in offline_runs(offline)}
    short, long = (tracking.wandb_run_id(rows[run_id]) for run_id in ("short-4000", "long-4000"))
    assert short != long and set(logged) == {short, long}
    assert short == f"dflash-eval-default-{rows['short-4000'].key_id}"
    for run_id, wandb_id in (("short-4000", short), ("long-4000", long)):
        history, sets = logged[wandb_id], reading.groups(rows[run_id].done)
        assert history["eval/tau_macro"] == rows[run_id].metrics["tau_macro"]
        for name in ("all prompts", "gsm8k", "humaneval"):
            interval = sets[name]["tau_macro"]
            assert history[f"sets/{name}/tau_macro"] == interval["value"]
            assert history[f"sets/{name}/tau_macro_low"] == interval["low"]
            assert history[f"sets/{name}/tau_macro_high"] == interval["high"]
            assert history[f"sets/{name}/tau_pooled_high"] == sets[name]["tau_pooled"]["high"]
        assert history["eval/tau_macro_low"] == sets["all prompts"]["tau_macro"]["low"]


def test_a_prompt_set_without_rounds_is_left_out_of_w_and_b_values(tmp_path):
    directory = pull_with_intervals(tmp_path, "r", 4000, 2.0)
    outcome = json.loads((directory / "results.json").read_text())
    outcome["by_dataset"]["datasets"]["gsm8k"].update(tau_macro=None, tau_pooled=None)
    (directory / "results.json").write_text(json.dumps(outcome))
    values = tracking.wandb_values(results.load_run(directory))
    assert "sets/humaneval/tau_macro" in values
    assert not [key for key in values if key.startswith("sets/gsm8k/")]


def test_wandb_sync_sends_runs_already_pulled_once(tmp_path, offline):
    root = tmp_path / "results"
    pull(root, 2000, 2.0, LOGGED[2000])
    pull(root, 4000, 3.0, None)
    inventory = tmp_path / "inventory.yaml"
    document = yaml.safe_load((REPO / "inventory.yaml").read_text())
    for host in document["hosts"].values():  # none is asked; were one, it would be loopback
        host["address"] = "127.0.0.1"
    inventory.write_text(yaml.safe_dump({**document, "local": {"results": str(root)}}))

    first = run_fab(inventory, "wandb-sync", "--project", "drafter-evals")
    assert first.returncode == 0, first.stderr
    assert "W&B: step 2000 logged to drafter-evals" in first.stdout
    assert "W&B: step 4000 logged to drafter-evals" in first.stdout
    assert "W&B: 2 run(s) sent to drafter-evals" in first.stdout
    again = run_fab(inventory, "wandb-sync", "--project", "drafter-evals")
    assert again.returncode == 0, again.stderr
    assert "logged" not in again.stdout
    assert f"W&B: nothing new to send to drafter-evals from {root}" in " ".join(
        again.stdout.split()
    )
    elsewhere = run_fab(inventory, "wandb-sync", "--project", "other-project")
    assert "W&B: 2 run(s) sent to other-project" in elsewhere.stdout  # sent per project
    for row in results.load_runs(root):  # each run knows where it went
        sent = json.loads((row.directory / tracking.SENT_FILE).read_text())["sent"]
        wandb_id = tracking.wandb_run_id(row)
        assert sent == [f"drafter-evals/{wandb_id}", f"other-project/{wandb_id}"]
    missing = run_fab(inventory, "wandb-sync")
    assert missing.returncode == 1 and "--project NAME" in missing.stderr


def test_a_run_w_and_b_refused_is_sent_by_the_next_sync(blocked, offline, monkeypatch):
    root = blocked
    said: list[str] = []
    assert tracking.sync("drafter-evals", root, said.append) == (0, 1)
    monkeypatch.setenv("WANDB_DIR", str(offline))
    assert tracking.sync("drafter-evals", root, said.append) == (1, 0)
    assert tracking.sync("drafter-evals", root, said.append) == (0, 0)


def test_wandb_sync_passes_over_a_run_flagged_not_comparable_and_says_so(tmp_path, offline):
    from tests.unit.test_set_anchors import TAMPERED, anchored, with_set

    root = tmp_path / "results"
    anchored(root)
    pulled(root, {"tampered": with_set(TAMPERED)})
    said: list[str] = []
    assert tracking.sync("drafter-evals", root, said.append) == (0, 0)
    assert any(line.startswith("[yellow]not comparable[/]: run tampered") for line in said)
