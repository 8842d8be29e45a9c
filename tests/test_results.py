"""Pulled results on the workstation, read through the shared schema: the comparison table and
the refusal to mix incomparable runs (run-eval's tests do the same on real harness output)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dflash_eval import schema

from dflash_ops.evaluation import results
from tests.schema_samples import results_dict


def pull(root: Path, run_id: str, step: int, outcome: dict | None) -> None:
    """A run directory as `fab fetch-results` leaves it."""
    directory = root / run_id
    directory.mkdir(parents=True)
    state = "succeeded" if outcome else "failed"
    run = {"run_id": run_id, "host": "eval", "state": state, "step": step, "started": step}
    (directory / "run.json").write_text(json.dumps(run))
    if outcome is not None:
        outcome[schema.CHECKPOINT][schema.STEP] = step
        (directory / "results.json").write_text(json.dumps(outcome))


def _with_text_number(where: str = "metrics") -> str:
    """A results file with text where a number (or a block of numbers) goes."""
    outcome = results_dict()
    if where == "metrics":
        outcome[schema.METRICS][schema.TAU_MACRO] = "3.0"
    else:
        outcome[where] = "<b>3.0</b>"
    return json.dumps(outcome)


def test_table_reads_each_run_through_the_schema(tmp_path):
    pull(tmp_path, "a", 2000, results_dict(budgets=("4",)))
    pull(tmp_path, "b", 4000, results_dict(reference=True, budgets=("4", "8")))
    pull(tmp_path, "c", 6000, None)  # failed: listed, not compared
    runs = results.load_runs(tmp_path)
    assert [run.step for run in runs] == [2000, 4000, 6000]
    comparison = results.compare(runs)
    assert results.check_mixed(comparison, allow_mixed=False) is None
    header, cells = results.table_rows(comparison)
    assert header == [
        "run", "step", "host", "τ macro", "τ pooled", "tree-4", "tree-8",
        "acc@1", "acc@2", "ref τ", "vs ref", "comparable",
    ]  # fmt: skip
    assert cells[0] == [
        "a", "2000", "eval", "1.500", "1.250", "1.750", "-", "0.500", "0.250", "-", "-", "yes",
    ]  # fmt: skip
    assert cells[1][-3:] == ["3.000", "0.50×", "yes"]


def test_runs_that_differ_in_what_shapes_the_numbers_are_refused_unless_allowed(tmp_path):
    longer = results_dict()
    longer[schema.PROMPTS][schema.MAX_NEW_TOKENS] = 48
    pull(tmp_path, "a", 2000, longer)
    pull(tmp_path, "b", 4000, results_dict())
    comparison = results.compare(results.load_runs(tmp_path))
    with pytest.raises(results.ResultsError, match="differ from the latest run in max new"):
        results.check_mixed(comparison, allow_mixed=False)
    assert "not comparable" in results.check_mixed(comparison, allow_mixed=True)
    _, cells = results.table_rows(comparison)
    assert [row[-1] for row in cells] == ["≠ max new tokens", "yes"]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("", "results.json: not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "results.json: nested deeper than"),  # RecursionError
        ("[" * 500 + "]" * 500, "results.json: nested deeper than"),  # json reads it; no more
        (_with_text_number(), "results.json: metrics.tau_macro: input should be a valid number"),
        (_with_text_number("by_dataset"), "results.json: by_dataset: input should be"),
        ("[1, 2]", "not a dflash-eval results file"),
        (
            f'{{"kind": "dflash-eval-results", "schema_version": {schema.SCHEMA_VERSION}}}',
            "results.json: checkpoint: missing",
        ),
    ],
)
def test_a_damaged_results_file_is_skipped_and_named_not_fatal(tmp_path, content, why):
    pull(tmp_path, "good", 2000, results_dict())
    pull(tmp_path, "bad", 4000, results_dict())
    (tmp_path / "bad" / "results.json").write_text(content)
    comparison = results.compare(results.load_runs(tmp_path))
    assert [row.run_id for row in comparison.rows] == ["good"]
    (skipped,) = comparison.skipped
    assert skipped.run_id == "bad" and why in skipped.problem


def test_a_results_file_of_another_schema_version_is_named(tmp_path):
    newer = results_dict()
    newer[schema.SCHEMA_VERSION_KEY] = schema.SCHEMA_VERSION + 1
    pull(tmp_path, "newer", 2000, newer)
    (run,) = results.load_runs(tmp_path)
    assert run.results is None and "schema_version" in run.problem


def test_only_failed_runs_is_one_clear_error(tmp_path):
    pull(tmp_path, "failed", 2000, None)
    with pytest.raises(results.ResultsError, match=r"no successful runs to compare \(1 failed"):
        results.compare(results.load_runs(tmp_path))


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("started", "yesterday", "run.json: started: input should be a valid number"),
        ("step", "4000", "run.json: step: input should be a valid integer"),
        ("host", ["eval"], "run.json: host: input should be a valid string"),
        ("finished", 1e400, "run.json: finished: input should be a finite number"),
    ],
)
def test_a_run_json_with_the_wrong_types_is_listed_broken(tmp_path, field, value, why):
    """Each of these crashed `compare` and `report` (TypeError while sorting or formatting)."""
    pull(tmp_path, "good", 2000, results_dict())
    pull(tmp_path, "bad", 4000, results_dict())
    run_file = tmp_path / "bad" / "run.json"
    run = json.loads(run_file.read_text())
    # json.dumps writes 1e400 as Infinity, which Python's json reads back as a float.
    run_file.write_text(json.dumps({**run, field: value}))
    comparison = results.compare(results.load_runs(tmp_path))
    assert [row.run_id for row in comparison.rows] == ["good"]
    (skipped,) = comparison.skipped
    assert skipped.run_id == "bad" and why in skipped.problem


def test_a_run_directory_with_a_control_character_in_its_name_is_listed_broken(tmp_path):
    pull(tmp_path, "good", 2000, results_dict())
    pull(tmp_path, "odd\nname", 4000, results_dict())
    comparison = results.compare(results.load_runs(tmp_path))
    assert [row.run_id for row in comparison.rows] == ["good"]
    (skipped,) = comparison.skipped
    assert skipped.run_id == "odd\\nname" and "control characters" in skipped.problem
