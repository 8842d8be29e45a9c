"""When no setting change closes the gap, what the diagnosis says instead: the other drafter
is another step of the candidate's own run (less trained, or the run got worse), or the gap
lies in what the target features give (the candidate gains less from them). Each from its
measured numbers, on diagnoses built by hand; the lab's own cases are in
tests/long/test_diagnose.py and benchmarks/diagnose_faults.py."""

from __future__ import annotations

from typing import Any

import pytest
from dflash_eval.diagnose import findings
from dflash_eval.diagnose.findings import (
    features_read_less,
    features_read_less_in_part,
    nothing_repairs,
    same_run,
)

GAP = {"mean": 0.8, "half_width": 0.2, "prompts": 8}
NO_EFFECT = {
    "verdict": "no measurable effect",
    "delta_tau": {"value": 0.01, "low": -0.02, "high": 0.04},
    "gap_closed": None,
    "label": "x",
}


def diagnosis(mine: str, theirs: str, steps=(2000, 6000), **changes: Any) -> dict[str, Any]:
    made = {
        "against": "step 6000",
        "candidate": {"checkpoint": mine, "step": steps[0]},
        "other": {"checkpoint": theirs, "step": steps[1]},
        "gap": GAP,
        "repairs": {"tried": [NO_EFFECT], "prompts": 8, "tau_candidate": 2.0},
    }
    made.update(changes)
    return made


@pytest.mark.parametrize(
    ("mine", "theirs"),
    [
        ("/srv/stage/run-a/step_2000/checkpoint.pt", "/srv/stage/run-a/step_6000/checkpoint.pt"),
        ("/ckpt/checkpoint-2000", "/ckpt/checkpoint-6000"),  # Hugging Face directories
    ],
)
def test_a_later_step_of_the_candidates_own_run_ahead_of_it_says_less_trained(mine, theirs):
    [found] = same_run(diagnosis(mine, theirs))
    assert found["area"] == "training"
    assert found["title"] == (
        "less trained: step 2000 is an earlier step of a run that is still improving "
        "(step 6000 is ahead by τ +0.80)"
    )
    assert "τ gap +0.80 ± 0.20 (95 %) over 8 prompts" in found["evidence"]


def test_an_earlier_step_of_the_same_run_ahead_says_the_run_got_worse():
    run = "/srv/stage/run-a"
    made = diagnosis(f"{run}/step_6000/checkpoint.pt", f"{run}/step_2000/checkpoint.pt")
    made["candidate"]["step"], made["other"]["step"] = 6000, 2000
    [found] = same_run(made)
    assert found["title"].startswith("the run got worse: step 6000 is behind its own earlier")
    assert "between steps 2000 and 6000" in found["check_next"]


FOUND = {**NO_EFFECT, "verdict": "finding"}


@pytest.mark.parametrize(
    "changes",
    [
        {"candidate": {"checkpoint": "/a/run-1/step_2000/checkpoint.pt", "step": 2000}},
        {"candidate": {"checkpoint": "/a/run-2/drafter.pt", "step": 2000}},  # no step directory
        {"candidate": {"checkpoint": "/a/run-2/step_2000/checkpoint.pt", "step": None}},
        {"gap": {"mean": 0.1, "half_width": 0.2, "prompts": 8}},  # not measurably behind
        {"repairs": {"tried": [FOUND, NO_EFFECT]}},  # a setting change closes it
    ],
)
def test_no_training_claim_without_both_steps_of_one_run_and_an_unexplained_gap(changes):
    made = diagnosis(
        "/a/run-2/step_2000/checkpoint.pt", "/a/run-2/step_6000/checkpoint.pt", **changes
    )
    assert same_run(made) == []


def shared(share: dict[str, float | None], verdict: str = "finding", tau: float = 1.6) -> dict:
    """A diagnosis whose features measurement (repair_runs.feature_share) found this share."""
    made = diagnosis("/a/c.pt", "/b/o.pt", steps=(None, None))
    made["candidate"]["feature_reliance"] = {"mean": 0.1, "half_width": 0.05, "prompts": 8}
    made["other"]["feature_reliance"] = {"mean": 0.9, "half_width": 0.1, "prompts": 8}
    made["repairs"]["tau_candidate"] = tau
    made["repairs"]["features"] = {
        "prompts": 8,
        "tau": tau + 0.8,
        "tau_blind": {"candidate": 1.5, "other": 1.7},
        "delta_tau": {"value": 0.8, "low": 0.6, "high": 1.0},
        "gap_closed": share,
        "p_value": 0.001,
        "verdict": verdict,
    }
    return made


def test_a_gap_mostly_in_what_the_features_give_comes_before_no_setting_change():
    made = shared({"value": 0.95, "low": 0.7, "high": 1.1})
    [found] = features_read_less(made)
    assert found["area"] == "features" and found["gap_closed"]["low"] == 0.7
    assert found["title"] == (
        "the candidate gains less from the target features than step 6000: "
        "95 % [70 %, 110 %] of the gap"
    )
    assert "costs the candidate τ +0.10 ± 0.05 and step 6000 τ +0.90 ± 0.10" in found["evidence"]
    assert "(without them: τ 1.50 and 1.70)" in found["evidence"]
    assert "over 2 measurements" in found["evidence"]  # one repair tried, and this
    assert features_read_less_in_part(made) == []
    order = findings.CHECKS
    assert order.index(features_read_less) < order.index(nothing_repairs)
    assert order.index(nothing_repairs) < order.index(features_read_less_in_part)
    assert order.index(same_run) < order.index(features_read_less)


def test_a_smaller_share_is_evidence_after_no_setting_change():
    made = shared({"value": 0.4, "low": 0.2, "high": 0.6})
    assert features_read_less(made) == []
    [found] = features_read_less_in_part(made)
    assert "40 % [20 %, 60 %] of the gap" in found["title"]


@pytest.mark.parametrize(
    "made",
    [
        shared({"value": 0.95, "low": 0.7, "high": 1.1}, verdict="no measurable effect"),
        shared(None),  # the candidate is not behind: no gap to share
        shared({"value": 0.95, "low": 0.7, "high": 1.1}, tau=1.03),  # at its floor
    ],
)
def test_no_features_claim_without_a_finding_a_gap_or_a_candidate_above_its_floor(made):
    assert features_read_less(made) == [] and features_read_less_in_part(made) == []


SHARED = {
    **FOUND,
    "label": "block size 16 (config 8)",
    "setting": "block_size",
    "value": 16,
    "tau": 3.47,
    "p_value": 0.0007,
    "delta_tau": {"value": 0.27, "low": 0.13, "high": 0.41},
    "gap_closed": {"value": 0.22, "low": 0.12, "high": 0.30},
    "control": {
        "other_delta_tau": {"value": 0.68, "low": 0.45, "high": 0.90},
        "beyond_other": {"value": -0.41, "low": -0.59, "high": -0.22},
        "widens_gap": True,
    },
}


def test_a_change_that_raises_the_other_drafter_more_is_evidence_not_a_repair():
    run = "/srv/stage/run-a"
    made = diagnosis(f"{run}/step_4000/checkpoint.pt", f"{run}/step_6000/checkpoint.pt")
    made["candidate"]["step"] = 4000
    made["repairs"].update(tried=[SHARED, NO_EFFECT], tau_candidate=3.2, prompts=10)
    assert findings.repairs(made) == []
    [shared] = findings.widening_settings(made)
    assert shared["area"] == "setting" and shared["setting"] == "block_size"
    assert shared["title"] == (
        "block size 16 (config 8) raises step 6000's τ more than the candidate's "
        "(3.20 → 3.47): not a repair"
    )
    assert "the same change gives step 6000 τ +0.68 [+0.45, +0.90]" in shared["evidence"]
    assert "the candidate τ -0.41 [-0.59, -0.22] beyond that" in shared["evidence"]
    # no repair of the candidate alone: the run's later step explains the gap
    [trained] = same_run(made)
    assert trained["title"].startswith("less trained: step 4000")
    [nothing] = nothing_repairs(made)
    assert nothing["title"] == "no setting change closes the gap (2 repairs tried)"
    assert "the largest repair, x, measured τ +0.01 [-0.02, +0.04]" in nothing["evidence"]
    assert "changes that widen the gap when made to both drafters: 1 (below" in nothing["evidence"]
    order = findings.CHECKS
    assert order.index(findings.repairs) < order.index(same_run)
    assert order.index(nothing_repairs) < order.index(findings.widening_settings)


def test_a_change_the_other_gains_no_more_from_stays_a_repair_of_the_candidate():
    own = {**SHARED, "control": {**SHARED["control"], "widens_gap": False}}
    made = diagnosis("/a/c.pt", "/b/o.pt", steps=(None, None))
    made["repairs"].update(tried=[own], tau_candidate=3.2, prompts=10)
    [found] = findings.repairs(made)
    assert found["title"] == "block size 16 (config 8): τ 3.20 → 3.47"
    fix = "check the training run's block_size; if it was 16, fix the config"
    assert found["check_next"] == fix
    assert findings.widening_settings(made) == [] and nothing_repairs(made) == []
    # a repair the other drafter cannot take (no control measured) stays one too
    uncontrolled = {k: v for k, v in own.items() if k != "control"}
    made["repairs"]["tried"] = [uncontrolled]
    assert len(findings.repairs(made)) == 1
