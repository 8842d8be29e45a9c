"""Training metrics read from the lab trainer's container over real SSH (pct stand-in as
root, its rootfs otherwise): `fab fetch-results` stores the values at the evaluated steps with
the pulled runs, `fab compare --format json` shows them; a log that has not reached a step
is read again by the next fetch; a missing or malformed log is one line and changes nothing
else. The pulled runs are results as the harness writes them (no eval venv: lab tier)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from dflash_lab import lab as labs
from dflash_lab.training_logs import LOG_DIR, logged_values, write_training_logs
from tests.conftest import run_fab
from tests.training_samples import pull

STEPS = (2000, 4000, 6000)


@pytest.fixture(scope="module")
def logs(lab: labs.Lab):
    """The logs in the shared lab's container, removed again afterwards."""
    sections = write_training_logs(lab, STEPS)
    yield sections
    shutil.rmtree(lab.container_path(LOG_DIR))


def setup(lab: labs.Lab, tmp_path: Path, metrics: dict) -> tuple[Path, Path]:
    """An inventory naming `metrics` for the trainer's checkpoints, with results of its own
    holding a pulled run of each step."""
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["hosts"]["trainer"]["metrics"] = metrics
    results = tmp_path / "results"
    document["local"]["results"] = str(results)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    for step in STEPS:
        pull(results, step, step / 2000, None)
    return path, results


def compared(inventory: Path) -> dict[int, dict]:
    shown = run_fab(inventory, "compare", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    return {run["step"]: run for run in json.loads(shown.stdout)["runs"]}


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tensorboard"])
def test_fetch_results_stores_the_values_at_the_evaluated_steps(lab, logs, tmp_path, fmt):
    if fmt not in logs:
        pytest.skip("tensorboardX is not installed: no event files to read")
    inventory, results = setup(lab, tmp_path, logs[fmt])
    fetched = run_fab(inventory, "fetch-results")
    assert fetched.returncode == 0, fetched.stderr
    assert "training metrics" not in fetched.stdout + fetched.stderr  # every step was there
    runs = compared(inventory)
    for step in STEPS:
        expected = logged_values(step)
        # event files hold float32: the same numbers to float32 precision
        assert runs[step]["train.loss"] == pytest.approx(expected["loss"], rel=1e-6)
        assert runs[step]["train.train_acc"] == pytest.approx(expected["train_acc"], rel=1e-6)
    stored = json.loads(next(results.glob("*step4000*/training.json")).read_text())
    assert stored["log"] == {"path": logs[fmt]["path"], "format": fmt}


def test_a_step_not_logged_yet_is_read_again_by_the_next_fetch(lab, logs, tmp_path):
    log_file = lab.container_path(f"{LOG_DIR}/early.jsonl")
    lines = [json.dumps({"step": s, **logged_values(s)}) + "\n" for s in (2000, 4000)]
    log_file.write_text("".join(lines))
    inventory, _ = setup(lab, tmp_path, {**logs["jsonl"], "path": f"{LOG_DIR}/early.jsonl"})
    try:
        first = run_fab(inventory, "fetch-results")
        assert first.returncode == 0, first.stderr
        assert (
            f"training metrics: {LOG_DIR}/early.jsonl logs no loss, train_acc at step 6000 yet; "
            "fab fetch-results reads it again"
        ) in first.stdout
        assert compared(inventory)[6000]["train.loss"] is None
        log_file.write_text("".join(lines) + json.dumps({"step": 6000, **logged_values(6000)}))
        assert "step 6000" in run_fab(inventory, "fetch-results").stdout  # no newline: written now
        log_file.write_text(log_file.read_text() + "\n")
        again = run_fab(inventory, "fetch-results")
        assert "training metrics" not in again.stdout
        assert compared(inventory)[6000]["train.loss"] == logged_values(6000)["loss"]
    finally:
        log_file.unlink()


@pytest.mark.parametrize(
    ("path", "content", "problem"),
    [
        ("gone.jsonl", None, "no such file; check the inventory's metrics.path"),
        (
            "bad.csv",
            "global_step,loss,train_acc\n2000,low,0.1\n",
            "line 2: loss: expected a number, found 'low'",
        ),
    ],
)
def test_a_missing_or_malformed_log_is_one_line_and_nothing_else_changes(
    lab, logs, tmp_path, path, content, problem
):
    log_file = lab.container_path(f"{LOG_DIR}/{path}")
    if content is not None:
        log_file.write_text(content)
    inventory, _ = setup(lab, tmp_path, {**logs["csv"], "path": f"{LOG_DIR}/{path}"})
    try:
        fetched = run_fab(inventory, "fetch-results")
    finally:
        log_file.unlink(missing_ok=True)
    assert fetched.returncode == 0, fetched.stderr
    assert "Traceback" not in fetched.stdout + fetched.stderr
    said = [line for line in fetched.stdout.splitlines() if line.startswith("training metrics")]
    assert len(said) == 1 and problem in said[0] and "(the results are unaffected)" in said[0]
    assert f"{LOG_DIR}/{path}" in said[0]
    runs = compared(inventory)
    assert sorted(runs) == list(STEPS) and all(
        run.get("train.loss") is None for run in runs.values()
    )
