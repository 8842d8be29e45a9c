"""When no repair closes a gap, `fab diagnose` reads the runs already pulled for the training
run: does τ still rise after the candidate's step (an earlier step of a run still improving)?"""

from __future__ import annotations

from dflash_ops.evaluation.diagnose import step_trend, trend_line
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
