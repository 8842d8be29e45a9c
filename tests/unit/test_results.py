"""Pulled results on the workstation, read through the shared schema: the comparison table and
the refusal to mix incomparable runs (run-eval's tests do the same on real harness output)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dflash_eval.contract import schema

from dflash_ops.core.errors import OpsError
from dflash_ops.evaluation import compare_rows, results
from tests.schema_samples import results_dict, sampled_results_dict


def pull(root: Path, run_id: str, step: int, outcome: dict | None) -> None:
    """A run directory as `fab fetch-results` leaves it."""
    directory = root / run_id
    directory.mkdir(parents=True)
    state = "succeeded" if outcome else "failed"
    run = {"run_id": run_id, "host": "eval", "state": state, "step": step, "started": step}
    (directory / "run.json").write_text(json.dumps(run))
    if outcome is not None:
        outcome["checkpoint"]["step"] = step
        (directory / "results.json").write_text(json.dumps(outcome))


def _with_tau(value: object) -> str:
    """A results file with `value` where τ macro (a number) goes."""
    outcome = results_dict()
    outcome["metrics"]["tau_macro"] = value
    return json.dumps(outcome)


def _with_text_block() -> str:
    """A results file with text where a block of numbers goes."""
    return json.dumps({**results_dict(), "by_dataset": "<b>3.0</b>"})


def test_table_reads_each_run_through_the_schema(tmp_path):
    pull(tmp_path, "a", 2000, results_dict(budgets=("4",)))
    pull(tmp_path, "b", 4000, results_dict(reference=True, budgets=("4", "8")))
    pull(tmp_path, "c", 6000, None)  # failed: listed, not compared
    runs = results.load_runs(tmp_path)
    assert [run.step for run in runs] == [2000, 4000, 6000]
    comparison = results.compare(runs)
    assert results.mixed_note(comparison) is None
    header, cells = compare_rows.table_rows(comparison)
    assert header == [
        "run", "step", "host", "τ macro", "τ pooled", "tree-4", "tree-8",
        "acc@1", "acc@2", "ref τ", "vs ref", "comparable",
    ]  # fmt: skip
    assert cells[0] == [
        "a", "2000", "eval", "1.500", "1.250", "1.750", "-", "0.500", "0.250", "-", "-", "yes",
    ]  # fmt: skip
    assert cells[1][-3:] == ["3.000", "0.50×", "yes"]


def test_runs_that_differ_in_what_shapes_the_numbers_are_flagged_against_the_largest_group(
    tmp_path,
):
    longer = results_dict()
    longer["prompts"]["max_new_tokens"] = 48
    pull(tmp_path, "a", 2000, results_dict())
    pull(tmp_path, "b", 4000, results_dict())
    pull(tmp_path, "c", 6000, longer)  # the latest run is the odd one: the others stay
    comparison = results.compare(results.load_runs(tmp_path))
    assert [len(group.rows) for group in comparison.groups] == [2, 1]
    assert "1 run(s) differ from comparability group 1 (2 run(s)) in max new tokens" in (
        results.mixed_note(comparison)
    )
    _, cells = compare_rows.table_rows(comparison)
    assert [row[-1] for row in cells] == ["yes", "yes", "≠ max new tokens"]
    assert [row.run_id for row in comparison.within().rows] == ["a", "b"]
    (line,) = results.group_lines(comparison)
    assert line.startswith("group 2: 1 run(s) (step 6000 c) differ in max new tokens")


def test_sampled_runs_read_and_compare_only_at_the_same_sampling_settings(tmp_path):
    pull(tmp_path, "a", 2000, sampled_results_dict(temperature=1.0))
    pull(tmp_path, "b", 4000, sampled_results_dict(temperature=0.7, seed=0))
    pull(tmp_path, "c", 6000, sampled_results_dict(temperature=0.7, seed=3))  # seed: comparable
    runs = results.load_runs(tmp_path)
    assert [run.problem for run in runs] == [None, None, None]  # T > 0 results parse
    comparison = results.compare(runs)
    assert "1 run(s) differ from comparability group 1 (2 run(s)) in sampling" in (
        results.mixed_note(comparison) or ""
    )
    _, cells = compare_rows.table_rows(comparison)
    assert [row[-1] for row in cells] == ["≠ sampling", "yes", "yes"]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("", "results.json: not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "results.json: nested deeper than"),  # RecursionError
        ("[" * 500 + "]" * 500, "results.json: nested deeper than"),  # json reads it; no more
        (_with_tau("3.0"), "results.metrics.tau_macro: expected a finite number, found str"),
        # json.dumps writes 1e400 as Infinity, which Python's json reads back as a float.
        (_with_tau(1e400), "results.metrics.tau_macro: expected a finite number, found float"),
        (_with_text_block(), "results.by_dataset: expected an object (ByDataset), found str"),
        ("[1, 2]", "not a dflash-eval results file"),
        (
            f'{{"kind": "dflash-eval-results", "schema_version": {schema.SCHEMA_VERSION}}}',
            "results: no checkpoint",
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
    newer["schema_version"] = schema.SCHEMA_VERSION + 1
    pull(tmp_path, "newer", 2000, newer)
    (run,) = results.load_runs(tmp_path)
    assert run.results is None and "schema_version" in run.problem


def test_only_failed_runs_is_one_clear_error(tmp_path):
    pull(tmp_path, "failed", 2000, None)
    with pytest.raises(results.ResultsError, match=r"no successful runs to compare \(1 failed"):
        results.compare(results.load_runs(tmp_path))


def test_a_group_is_chosen_by_number_or_by_a_run_of_it(tmp_path):
    longer = results_dict()
    longer["prompts"]["max_new_tokens"] = 48
    for run_id, step in (("20261201-120000-step2000-eval-aaaa", 2000), ("x-step4000-bbbb", 4000)):
        pull(tmp_path, run_id, step, results_dict())
    pull(tmp_path, "20261201-130000-step6000-eval-cccc", 6000, longer)
    runs = results.load_runs(tmp_path)
    second = results.compare(runs, group=2)
    assert second.compared == 2 and second.differences.keys() == {
        "20261201-120000-step2000-eval-aaaa",
        "x-step4000-bbbb",
    }
    assert [r.step for r in second.within().rows] == [6000]
    assert results.compare(runs, baseline="cccc").compared == 2  # its short id
    assert results.compare(runs, baseline="step4000").compared == 1  # any unique part
    with pytest.raises(results.ResultsError, match="pass 1 to 2"):
        results.compare(runs, group=3)
    with pytest.raises(OpsError, match="part of several run ids"):
        results.compare(runs, baseline="step")
    with pytest.raises(results.ResultsError, match="pass one of them"):
        results.compare(runs, group=1, baseline="cccc")


def test_run_records_carry_plain_values_and_short_ids(tmp_path):
    pull(tmp_path, "20261201-120000-step2000-eval-ab12", 2000, results_dict(budgets=("4", "8")))
    pull(tmp_path, "20261201-130000-step4000-eval-cd34", 4000, results_dict(reference=True))
    records = compare_rows.run_records(results.compare(results.load_runs(tmp_path)))
    first, second = records
    assert (first["short_id"], first["step"], first["group"]) == ("ab12", 2000, 1)
    assert first["best_tree"] == max(first["tree_4"], first["tree_8"])
    assert first["best_tree_budget"] in (4, 8) and first["comparable"] is True
    assert second["vs_reference"] == 0.5 and second["reference_tau"] == 3.0


def _with_drafter(version: int, layer_types: list[str], attention: list[dict] | None) -> dict:
    outcome = results_dict()
    outcome["schema_version"] = version
    outcome["drafter"]["config"] = {"layer_types": layer_types}
    if attention is None:  # schema 2 recorded no rule
        del outcome["drafter"]["attention"]
    else:
        outcome["drafter"]["attention"] = attention
    return outcome


def test_runs_masked_under_the_old_sliding_rule_are_kept_apart_and_told_why(tmp_path):
    sliding = ["sliding_attention", "full_attention"]
    now = [
        {"kind": "sliding_attention", "causal": True, "window": 8},
        {"kind": "full_attention", "causal": False, "window": None},
    ]
    pull(tmp_path, "old", 2000, _with_drafter(2, sliding, None))
    pull(tmp_path, "new", 4000, _with_drafter(3, sliding, now))
    comparison = results.compare(results.load_runs(tmp_path))
    assert comparison.differences == {"old": ["attention rule"]}
    note = results.mixed_note(comparison) or ""
    assert "in attention rule" in note and "masked sliding-window layers both ways" in note


def test_full_attention_drafters_compare_across_the_mask_rule_change(tmp_path):
    full = ["full_attention", "full_attention"]
    plain = [{"kind": "full_attention", "causal": False, "window": None}] * 2
    pull(tmp_path, "old", 2000, _with_drafter(2, full, None))
    pull(tmp_path, "new", 4000, _with_drafter(3, full, plain))
    assert results.compare(results.load_runs(tmp_path)).differences == {}
    # A full layer made causal by is_causal is a rule of its own.
    causal = [{**layer, "causal": True} for layer in plain]
    pull(tmp_path, "causal", 6000, _with_drafter(3, full, causal))
    differences = results.compare(results.load_runs(tmp_path)).differences
    assert differences == {"causal": ["attention rule"]}  # apart from the larger group


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
