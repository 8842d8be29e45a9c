"""The workstation's record of its feature sets (evaluation/set_anchors.py): a pulled run whose
set's feature-set.json is none the workstation made or relayed is flagged not comparable,
named; a set it has no record of flags nothing; compare and its notes show the flag."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dflash_ops.core.errors import HostError
from dflash_ops.evaluation import compare_rows, results, set_anchors, tracking, training_fetch
from dflash_ops.evaluation.set_anchors import (
    anchor_file,
    anchor_problem,
    read_anchor,
    record_made,
    record_relayed,
)
from tests.schema_samples import pulled, results_dict

SET = "tiny-target-0123456789ab"
MADE, REMADE, TAMPERED = "a" * 64, "b" * 64, "c" * 64


def anchored(root: Path) -> set_anchors.SetAnchor:
    record_made(root, SET, "features", f"/f/features/{SET}", MADE, computed=True)
    record_relayed(root, SET, "eval", MADE)
    anchor = read_anchor(root, SET)
    assert anchor is not None
    return anchor


def test_a_run_on_the_set_as_made_or_relayed_is_not_flagged(tmp_path):
    anchor = anchored(tmp_path)
    assert anchor.hosts == {"features": MADE, "eval": MADE}
    assert anchor_problem(anchor, "eval", MADE) is None


def test_a_run_on_a_changed_set_is_flagged_naming_set_host_both_shas_and_the_fix(tmp_path):
    problem = anchor_problem(anchored(tmp_path), "eval", TAMPERED)
    assert problem is not None
    assert problem.startswith(f"feature set {SET} on eval: ")
    assert f"sha256 {TAMPERED[:12]}…" in problem
    assert f"recorded {MADE[:12]}… when it relayed it there" in problem
    assert "fab extract-features --to eval --verify" in problem


def test_without_an_anchor_or_a_recorded_sha_nothing_is_flagged(tmp_path):
    assert anchor_problem(None, "eval", TAMPERED) is None  # a set made before the records
    assert anchor_problem(anchored(tmp_path), "eval", None) is None  # an older harness


def test_a_set_computed_again_keeps_earlier_makes_valid(tmp_path):
    anchored(tmp_path)
    record_made(tmp_path, SET, "features", f"/f/features/{SET}", REMADE, computed=True)
    anchor = read_anchor(tmp_path, SET)
    assert anchor.sha256 == [MADE, REMADE]
    assert anchor_problem(anchor, "eval", MADE) is None  # runs pulled before the remake
    assert anchor_problem(anchor, "eval", REMADE) is None


def test_a_found_set_that_changed_on_its_features_host_is_refused(tmp_path):
    anchored(tmp_path)
    with pytest.raises(HostError) as refused:
        record_made(tmp_path, SET, "features", f"/f/features/{SET}", TAMPERED, computed=False)
    message = str(refused.value)
    assert message.startswith(f"features: feature set {SET} at /f/features/{SET}: ")
    assert TAMPERED[:12] in message and MADE[:12] in message
    assert read_anchor(tmp_path, SET).sha256 == [MADE]
    record_made(tmp_path, SET, "features", "/f", MADE, computed=False)  # as made: fine


def test_a_relayed_copy_of_an_unknown_sha_is_not_recorded(tmp_path):
    anchored(tmp_path)
    record_relayed(tmp_path, SET, "eval2", TAMPERED)  # a copy whose manifest names another
    assert "eval2" not in read_anchor(tmp_path, SET).hosts


def test_a_set_name_from_a_host_never_becomes_a_path_elsewhere(tmp_path):
    assert anchor_file(tmp_path, "../../etc/passwd-0123456789ab") is None
    assert anchor_file(tmp_path, "..") is None
    assert read_anchor(tmp_path, "../x") is None
    assert anchor_file(tmp_path, SET) == tmp_path / "feature-sets" / f"{SET}.json"


# --- pulled runs ----------------------------------------------------------------------------


def with_set(sha256: str | None) -> dict:
    made = results_dict()
    made["features"] = {
        "host": "features",
        "device": "cpu",
        "dtype": "float32",
        "dtype_source": "--target-dtype",
        "kernel": {"attention": "sdpa"},
        "libraries": {"torch": "2.13.0"},
        "source": "feature set",
        "fidelity": {"status": "not needed"},
        "target_load": {"body_loaded": False, "tensors_read": "all"},
        "cache": {"completion_hits": 2, "hidden_state_hits": 2, "prompts": 2},
        "set": SET,
    }
    if sha256 is not None:
        made["features"]["set_sha256"] = sha256
    return made


def test_compare_flags_a_run_on_a_changed_set_and_leaves_it_out(tmp_path):
    anchored(tmp_path)
    runs = pulled(
        tmp_path, {"good": with_set(MADE), "tampered": with_set(TAMPERED), "old": with_set(None)}
    )
    comparison = results.compare(runs)
    assert [group.number for group in comparison.groups] == [1]  # same key: one group
    assert comparison.differences == {"tampered": [set_anchors.FLAG]}
    records = {r.run_id: r.flat() for r in compare_rows.run_records(comparison)}
    assert records["tampered"]["comparable"] is False
    assert records["tampered"]["differs"] == "feature set changed"
    assert records["good"]["comparable"] and records["old"]["comparable"]
    assert [row.run_id for row in comparison.within().rows] == ["good", "old"]
    note = results.mixed_note(comparison)
    assert f"tampered: feature set {SET} on eval: " in note and TAMPERED[:12] in note


def test_a_group_of_flagged_runs_is_never_the_one_compared_against(tmp_path):
    anchored(tmp_path)
    other = with_set(MADE)
    other["prompts"]["sha256"] = "q" * 64  # another comparability group, of one run
    runs = pulled(
        tmp_path,
        {"bad-1": with_set(TAMPERED), "bad-2": with_set(TAMPERED), "fine": other},
    )
    comparison = results.compare(runs)
    assert [row.run_id for row in comparison.group.rows] == ["fine"]
    assert set(comparison.differences) == {"bad-1", "bad-2"}
    assert comparison.differences["bad-1"] == ["prompts", set_anchors.FLAG]


def test_a_damaged_record_flags_the_run_naming_the_file(tmp_path):
    path = anchor_file(tmp_path, SET)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    [run] = pulled(tmp_path, {"run": with_set(MADE)})
    assert run.flag is not None and str(path) in run.flag and "cannot be checked" in run.flag


def test_a_flagged_run_pulled_by_watch_or_run_eval_is_said_and_sent_nowhere(tmp_path):
    anchored(tmp_path)
    pulled(tmp_path, {"tampered": with_set(TAMPERED)})
    said: list[str] = []
    # after_pull's inventory: only where the results are (a flagged run reads nothing else)
    inventory = SimpleNamespace(local=SimpleNamespace(results=tmp_path))
    tracking.after_pull(inventory, ["tampered"], said.append, wandb_project="drafter-evals")
    (line,) = said
    assert line.startswith(f"[yellow]not comparable[/]: run tampered: feature set {SET} on eval")
    assert TAMPERED[:12] in line and "left out of comparisons, training metrics and W&B" in line
    assert not (tmp_path / "tampered" / tracking.SENT_FILE).exists()


def test_fetch_results_reads_no_training_metrics_for_a_flagged_run(tmp_path):
    pulled(tmp_path, {"tampered": with_set(TAMPERED)})
    anchored(tmp_path)
    [flagged] = [run for run in results.load_runs(tmp_path) if run.flag]
    said: list[str] = []
    # no metrics log named: a run considered at all would make attach look one up
    inventory = SimpleNamespace(local=SimpleNamespace(results=tmp_path))
    assert training_fetch.attach(inventory, tmp_path, said.append) == 0
    assert said == [] and flagged.run_id == "tampered"
