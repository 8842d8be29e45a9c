"""When no repair closes a gap, `fab diagnose` reads the runs already pulled for the training
run: does τ still rise after the candidate's step (an earlier step of a run still improving)?
A rise beyond the intervals is ranked first in the pulled diagnosis."""

from __future__ import annotations

import json

import pytest

from dflash_ops.evaluation import results
from dflash_ops.evaluation.diagnose import (
    finish_pulled,
    read_diagnosis,
    step_trend,
    trend_finding,
    trend_line,
    with_trend,
)
from tests.unit.test_report import pull


def test_a_run_still_improving_after_the_step_is_said_so(tmp_path):
    for step, level in ((2000, 1.5), (4000, 2.5), (6000, 3.5)):
        pull(tmp_path, step, level)
    trend = step_trend(tmp_path, None, 2000)
    assert list(trend["taus"]) == [2000, 4000, 6000]
    assert trend["taus"][2000] < trend["taus"][6000] and trend["rises"]
    assert trend["best_later_step"] == 6000
    line = trend_line(trend, 2000)
    assert "τ still rises after step 2000" in line and "still improving" in line


def test_a_run_that_stopped_improving_is_not_called_less_trained(tmp_path):
    for step, level in ((2000, 3.5), (4000, 2.5)):
        pull(tmp_path, step, level)
    trend = step_trend(tmp_path, None, 2000)
    assert not trend["rises"]
    assert "does not rise after step 2000" in trend_line(trend, 2000)


def test_no_trend_without_the_step_or_a_later_one(tmp_path):
    assert step_trend(tmp_path / "nothing", None, 2000) is None
    for step, level in ((2000, 1.5), (4000, 2.5)):
        pull(tmp_path, step, level)
    assert step_trend(tmp_path, None, 4000) is None  # nothing after it
    assert step_trend(tmp_path, None, 3000) is None  # the candidate's own step not pulled
    assert step_trend(tmp_path, "other-run", 2000) is None  # another training run's steps


def diagnosis_of(*findings: dict) -> dict:
    return {"findings": [{"rank": i, **f} for i, f in enumerate(findings, start=1)]}


NOTHING = {"area": "repair", "title": "no setting change closes the gap (12 repairs tried)"}


def test_a_measured_rise_after_the_step_is_ranked_first_in_the_pulled_diagnosis(tmp_path):
    for step, level in ((2000, 1.5), (4000, 2.5), (6000, 3.5)):
        pull(tmp_path, step, level)
    pulled = tmp_path / "diagnose.json"
    pulled.write_text(json.dumps(diagnosis_of(NOTHING)))
    trend = step_trend(tmp_path, None, 2000)
    low, high = trend["intervals"][2000]
    assert low < trend["taus"][2000] < high < trend["intervals"][6000][0]
    shown = finish_pulled(pulled, tmp_path, None, 2000)
    first, second = shown["findings"]
    assert first["rank"] == 1 and first["area"] == "training"
    assert first["title"].startswith("less trained: step 2000 is an earlier step of a run that")
    assert f"step 2000 τ {trend['taus'][2000]:.2f} [{low:.2f}, {high:.2f}]" in first["evidence"]
    assert second == {**NOTHING, "rank": 2}
    assert json.loads(pulled.read_text())["findings"] == shown["findings"]  # the file too


def test_a_rise_within_the_intervals_is_not_called_less_trained(tmp_path):
    pull(tmp_path, 4000, 3.0)
    pull(tmp_path, 6000, 3.05)  # within the noise of 4000
    trend = step_trend(tmp_path, None, 4000)
    assert trend["rises"] and trend_finding(trend, 4000, []) is None


@pytest.mark.parametrize(
    "found",
    [
        {"area": "repair", "title": "block_size 16", "setting": "block_size"},
        {"area": "weights", "title": "3 parameters hold NaN or inf"},
        {"area": "loading", "title": "the candidate does not load strictly"},
        # the harness's own: the other drafter is a later step of this run (no second one)
        {"area": "training", "title": "less trained: step 2000 is an earlier step of a run"},
    ],
)
def test_no_less_trained_claim_beside_a_repair_or_a_broken_candidate(tmp_path, found):
    for step, level in ((2000, 1.5), (6000, 3.5)):
        pull(tmp_path, step, level)
    pulled = tmp_path / "diagnose.json"
    pulled.write_text(json.dumps(diagnosis_of(found)))
    trend = step_trend(tmp_path, None, 2000)
    shown = with_trend(read_diagnosis(pulled), trend, 2000)
    assert shown["findings"] == [{"rank": 1, **found}] and shown["step_trend"] == trend


def test_only_runs_measured_as_the_diagnosis_make_its_trend(tmp_path):
    """The diagnosis ran at 96 new tokens: the runs at 48 are another τ, not its trend."""
    for step, level in ((2000, 1.5), (6000, 3.5)):
        pull(tmp_path, step, level, prompts={"max_new_tokens": 48})
    pull(tmp_path, 4000, 2.5)
    [at_4000] = [run for run in results.load_runs(tmp_path) if run.step == 4000]
    measured = at_4000.done["prompts"]
    assert step_trend(tmp_path, None, 2000, measured) is None  # 2000 was measured otherwise
    other = {**measured, "max_new_tokens": 48}
    assert list(step_trend(tmp_path, None, 2000, other)["taus"]) == [2000, 6000]
    assert list(step_trend(tmp_path, None, 2000)["taus"]) == [2000, 6000]  # largest group
