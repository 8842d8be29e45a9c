"""What `fab compare --format json|csv|markdown` prints and `fab export` writes, byte for
byte, for a fixed set of pulled runs (several training runs, a tag, a reference, training
metrics with a gap and a non-finite value, runs with and without per-set intervals, runs of
other comparability groups), and what W&B is sent for each. The files under compare_output/
are that output, captured at 901abbf (the last commit whose run records were dicts built
inline): a change of a key, its order or a value shows here as a diff; when it is meant,
write the new output into the file (the test's failure prints it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_ops.evaluation import results, tracking
from dflash_ops.evaluation.training_metrics import TRAINING_FILE
from tests.conftest import run_fab
from tests.schema_samples import results_dict, sampled_results_dict
from tests.unit.test_inert_text import _inventory
from tests.unit.test_report import pull

SHOWN = Path(__file__).with_name("compare_output")
COMPARE = {
    "compare.json": ("--format", "json"),
    "compare.csv": ("--format", "csv"),
    "compare.md": ("--format", "markdown"),
    "compare-wide.md": ("--format", "markdown", "--wide"),
    "compare-mixed.json": ("--format", "json", "--allow-mixed"),
    "compare-mixed.csv": ("--format", "csv", "--allow-mixed"),
}


def _pulled(root: Path, run_id: str, step: int, outcome: dict, **run: object) -> Path:
    outcome["checkpoint"]["step"] = step
    directory = root / run_id
    directory.mkdir(parents=True)
    summary = {"run_id": run_id, "host": "eval-2", "state": "succeeded", "step": step, **run}
    (directory / "run.json").write_text(json.dumps({**summary, "started": step}))
    (directory / "results.json").write_text(json.dumps(outcome))
    return directory


def _trained(directory: Path, step: int, values: dict) -> None:
    record = {"step": step, "log": {"path": "/w/m.jsonl", "format": "jsonl"}, "values": values}
    (directory / TRAINING_FILE).write_text(json.dumps(record))


@pytest.fixture(scope="module")
def pulled(tmp_path_factory) -> tuple[Path, Path]:
    """The fixed runs, and an inventory whose results they are."""
    root = tmp_path_factory.mktemp("compared") / "results"
    pull(root, 2000, 2.0, checkpoint={"training_run": "v5"})
    pull(root, 4000, 3.0)
    _trained(root / "run-2000", 2000, {"loss": 2.5, "acc": 0.25})
    _trained(root / "run-4000", 4000, {"loss": 1.75, "acc": "nan", "lr": 3e-4})
    old = results_dict(reference=True, budgets=("4", "8", "16"))
    _pulled(root, "old-5000", 5000, old, tag="base")
    _pulled(root, "sampled-6000", 6000, sampled_results_dict(), tag="t07")
    longer = results_dict(budgets=("4",))
    longer["prompts"]["max_new_tokens"] = 48
    _pulled(root, "long-7000", 7000, longer)
    return root, _inventory(root.parent, root)


@pytest.mark.parametrize("name", list(COMPARE))
def test_compare_prints_what_it_printed(pulled, name):
    _, inventory = pulled
    shown = run_fab(inventory, "compare", *COMPARE[name])
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == (SHOWN / name).read_text(), shown.stdout


@pytest.mark.parametrize("suffix", ["csv", "json"])
def test_export_writes_what_it_wrote(pulled, tmp_path, suffix):
    _, inventory = pulled
    out = tmp_path / f"tidy.{suffix}"
    written = run_fab(inventory, "export", "--out", str(out))
    assert written.returncode == 0, written.stderr
    assert out.read_text() == (SHOWN / f"export.{suffix}").read_text(), out.read_text()


def test_wandb_is_sent_what_it_was_sent(pulled):
    root, _ = pulled
    sent = {
        row.run_id: list(tracking.wandb_values(row).items())
        for row in results.load_runs(root)
        if row.results is not None
    }
    text = json.dumps(sent, indent=1) + "\n"
    assert text == (SHOWN / "wandb.json").read_text(), text
