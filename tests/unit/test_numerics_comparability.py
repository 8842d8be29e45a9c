"""Comparability keys on the harness's numerics version, not on its content hash: a harness
edit that moves no number keeps earlier results comparable, one that does (a raised version)
sets them apart; results written before the version was recorded are grouped by their
harness hash, or as version 1 where that hash is a known version-1 harness."""

from __future__ import annotations

import pytest
from dflash_eval.contract import reading
from dflash_eval.contract.schema_check import SchemaError, parse_results
from dflash_eval.contract.version import (
    NUMERICS_OF_UNVERSIONED,
    NUMERICS_VERSION,
    compared_numerics,
)

from dflash_ops.evaluation import results
from dflash_ops.evaluation.foresee import comparability_warning, expected_key
from dflash_ops.evaluation.harness_options import harness_args
from dflash_ops.evaluation.request import EvalRequest
from tests.schema_samples import pulled, results_dict, sampled_results_dict

KNOWN_OLD = next(iter(NUMERICS_OF_UNVERSIONED))


def outcome(content: str, numerics: int | None, sampled: bool = False) -> dict:
    """Results of a harness with this content hash, recording this numerics version (None:
    written before the version was recorded), greedy or sampled."""
    made = sampled_results_dict() if sampled else results_dict()
    made["harness"]["content_sha256"] = content
    if numerics is not None:
        made["harness"]["numerics_version"] = numerics
    return made


def groups_of(comparison: results.Comparison) -> list[tuple[list[str], list[str]]]:
    return [(sorted(row.run_id for row in g.rows), g.differs) for g in comparison.groups]


def test_harnesses_of_one_numerics_version_are_comparable_whatever_their_code(tmp_path):
    runs = pulled(tmp_path, {"a": outcome("1" * 64, 1), "b": outcome("2" * 64, 1)})
    comparison = results.compare(runs)
    assert groups_of(comparison) == [(["a", "b"], [])]
    assert results.mixed_note(comparison) is None


def test_a_raised_numerics_version_sets_its_results_apart_and_says_why(tmp_path):
    runs = pulled(
        tmp_path,
        {
            "a": outcome("1" * 64, 1, sampled=True),
            "b": outcome("1" * 64, 1, sampled=True),
            "c": outcome("2" * 64, 2, sampled=True),
        },
    )
    comparison = results.compare(runs)
    assert groups_of(comparison) == [(["a", "b"], []), (["c"], ["numerics"])]
    note = results.mixed_note(comparison)
    assert "differ from comparability group 1 (2 run(s)) in numerics" in note
    assert "harness.numerics_version" in note


def test_greedy_runs_of_a_version_that_moved_only_sampled_numbers_stay_comparable(tmp_path):
    runs = pulled(tmp_path, {"v1": outcome("1" * 64, 1), "v2": outcome("2" * 64, 2)})
    assert groups_of(results.compare(runs)) == [(["v1", "v2"], [])]
    assert reading.numerics(runs[1].done) == 1
    later = pulled(tmp_path / "later", {"v2": outcome("2" * 64, 2), "v3": outcome("3" * 64, 3)})
    assert [rows for rows, _ in groups_of(results.compare(later))] in (
        [["v2"], ["v3"]],
        [["v3"], ["v2"]],
    )


def test_results_without_a_version_group_by_their_harness_hash(tmp_path):
    runs = pulled(
        tmp_path,
        {
            "old-a": outcome("a" * 64, None),
            "old-a-again": outcome("a" * 64, None),
            "old-b": outcome("b" * 64, None),
            "new": outcome("c" * 64, 1),
        },
    )
    comparison = results.compare(runs)
    assert groups_of(comparison) == [
        (["old-a", "old-a-again"], []),
        (["new"], ["numerics"]),
        (["old-b"], ["numerics"]),
    ]
    assert reading.numerics(runs[2].done) == f"unversioned harness {'b' * 16}"


def test_an_unversioned_result_of_a_known_version_1_harness_counts_as_version_1(tmp_path):
    assert NUMERICS_OF_UNVERSIONED[KNOWN_OLD] == 1
    runs = pulled(tmp_path, {"old": outcome(KNOWN_OLD, None), "new": outcome("c" * 64, 1)})
    assert groups_of(results.compare(runs)) == [(["new", "old"], [])]


def test_the_numerics_version_is_read_as_the_schema_types_it():
    made = outcome("1" * 64, 1)
    assert parse_results(made)["harness"]["numerics_version"] == 1
    made["harness"]["numerics_version"] = "1"
    with pytest.raises(SchemaError, match="numerics_version"):
        parse_results(made)


def test_a_run_is_foreseen_under_the_numerics_version_of_the_harness_it_deploys(tmp_path):
    sampled = EvalRequest(step=1, harness_args=harness_args({"temperature": "0.7"}))
    assert expected_key(sampled)["numerics"] == NUMERICS_VERSION
    assert expected_key(EvalRequest(step=1))["numerics"] == compared_numerics(
        NUMERICS_VERSION, sampled=False
    )
    older = outcome("1" * 64, NUMERICS_VERSION - 1, sampled=True)
    pulled(tmp_path, {"a": older})
    warning = comparability_warning(tmp_path, sampled)
    assert (
        f"numerics version {NUMERICS_VERSION} vs {NUMERICS_VERSION - 1} (the harness computes "
        "its numbers differently)"
    ) in warning
