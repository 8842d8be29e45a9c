"""The statistics behind diagnose's repairs: the paired intervals, Fieller's
interval for the share of the gap closed, Holm's rule and the verdicts."""

from __future__ import annotations

import math
import random

import pytest
from dflash_eval.diagnose import repair_stats as rs


def test_mean_interval_is_the_t_interval():
    interval = rs.mean_interval([1.0, 2.0, 3.0, 4.0])
    half = 3.18245 * math.sqrt((5 / 3) / 4)
    assert interval.value == 2.5
    assert interval.low == pytest.approx(2.5 - half, rel=1e-4)
    assert interval.high == pytest.approx(2.5 + half, rel=1e-4)
    assert rs.mean_interval([3.0]) == rs.Interval(3.0, None, None)


def test_fieller_bounds_are_where_the_residual_t_test_turns():
    rng = random.Random(3)
    gap = [1.0 + rng.gauss(0, 0.2) for _ in range(6)]
    delta = [0.6 * g + rng.gauss(0, 0.1) for g in gap]
    interval = rs.ratio_interval(delta, gap)
    assert interval.value == pytest.approx(sum(delta) / sum(gap))
    t = rs.t_quantile(0.975, 5)

    def statistic(ratio):
        residual = [d - ratio * g for d, g in zip(delta, gap, strict=True)]
        mean = sum(residual) / 6
        spread = math.sqrt(sum((r - mean) ** 2 for r in residual) / 5 / 6)
        return abs(mean) / spread

    assert statistic(interval.low) == pytest.approx(t, rel=1e-6)
    assert statistic(interval.high) == pytest.approx(t, rel=1e-6)
    assert statistic(interval.value) < t
    assert statistic(interval.low - 0.01) > t and statistic(interval.high + 0.01) > t


def test_fieller_is_unbounded_when_the_gap_is_not_told_from_zero():
    interval = rs.ratio_interval([0.1, 0.2, 0.1], [1.0, -0.9, 0.1])
    assert interval.low is None and interval.high is None
    assert rs.ratio_interval([0.5], [1.0]) == rs.Interval(0.5, None, None)


def test_intervals_cover_at_their_level_with_few_prompts():
    """Coverage over simulated 5-prompt sets: the t interval of the mean and Fieller's
    interval of the share closed, both near 95 % (a normal interval would give ~88 %)."""
    rng = random.Random(11)
    trials, mean_hits, ratio_hits = 3000, 0, 0
    for _ in range(trials):
        gap = [0.8 + rng.gauss(0, 0.3) for _ in range(5)]
        delta = [0.5 * g + rng.gauss(0, 0.15) for g in gap]
        interval = rs.mean_interval(delta)
        mean_hits += interval.low <= 0.4 <= interval.high
        ratio = rs.ratio_interval(delta, gap)
        ratio_hits += ratio.low is not None and ratio.low <= 0.5 <= ratio.high
    assert 0.935 <= mean_hits / trials <= 0.965
    assert 0.935 <= ratio_hits / trials <= 0.965


def test_rise_p_value_is_the_one_sided_paired_t_test():
    assert rs.rise_p_value([1.0, 2.0, 3.0, 4.0]) == pytest.approx(
        rs.t_upper_tail(2.5 / math.sqrt((5 / 3) / 4), 3)
    )
    assert rs.rise_p_value([-1.0, -2.0, -3.0]) > 0.95
    assert rs.rise_p_value([0.2, 0.2]) == 0.0 and rs.rise_p_value([-0.2, -0.2]) == 1.0
    assert rs.rise_p_value([0.5]) == 1.0


def test_holm_steps_down_and_stops_at_the_first_kept():
    assert rs.holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert rs.holm([0.04, 0.04]) == [False, False]  # each would pass alone at 0.05
    assert rs.holm([0.02, 0.04]) == [True, True]
    assert rs.holm([]) == []


def _repair(name, delta_per_prompt, gap=1.0, n=6):
    base = [2.0] * n
    other = [2.0 + gap + 0.01 * i for i in range(n)]
    return rs.measure(
        name, base, [b + d for b, d in zip(base, delta_per_prompt, strict=True)], other
    )


def test_measure_needs_equal_per_prompt_lists():
    with pytest.raises(ValueError, match="unequal lengths"):
        rs.measure("x", [1.0, 2.0], [1.0], [3.0, 3.0])
    with pytest.raises(ValueError, match="or none"):
        rs.measure("x", [], [], [])


def test_verdicts_need_significance_after_holm_and_a_minimum_effect():
    big = _repair("block_size", [0.8, 0.9, 0.85, 0.8, 0.95, 0.9])
    tiny = _repair("layer +1", [0.03, 0.04, 0.03, 0.04, 0.035, 0.03])  # significant, small
    noise = _repair("mask", [0.3, -0.2, 0.1, -0.1, 0.2, -0.25])
    small_share = _repair("layers", [0.08, 0.09, 0.08, 0.09, 0.085, 0.08], gap=2.0)
    judged = rs.judge([tiny, noise, big, small_share])
    assert judged[0].name == "block_size"
    verdicts = {r.name: r.verdict for r in judged}
    assert verdicts == {
        "block_size": rs.FINDING,
        "layer +1": rs.NO_EFFECT,
        "mask": rs.NO_EFFECT,
        "layers": rs.NO_EFFECT,  # Δτ 0.085 clears 0.05, but 4 % of a 2.0 gap does not
    }
    closed = judged[0].gap_closed
    assert closed.low < closed.value < closed.high and closed.value == pytest.approx(0.86, abs=0.02)


def test_findings_rank_by_the_lower_bound_of_the_gap_closed():
    steady = _repair("steady", [0.60, 0.61, 0.59, 0.60, 0.61, 0.60])
    noisy = _repair("noisy", [0.2, 1.3, 0.4, 1.2, 0.3, 1.1])  # larger mean, wider interval
    judged = rs.judge([noisy, steady])
    assert [r.verdict for r in judged] == [rs.FINDING, rs.FINDING]
    assert noisy.delta_tau.value > steady.delta_tau.value
    assert [r.name for r in judged] == ["steady", "noisy"]


def test_without_a_gap_only_delta_tau_is_judged():
    repair = _repair("x", [0.3] * 6, gap=-0.5)
    assert repair.gap_closed is None
    assert rs.judge([repair])[0].verdict == rs.FINDING


def test_two_prompts_already_give_bounded_intervals():
    interval = rs.mean_interval([1.0, 3.0])
    assert interval.low == pytest.approx(2.0 - 12.7062, rel=1e-4)
    assert interval.high == pytest.approx(2.0 + 12.7062, rel=1e-4)
    ratio = rs.ratio_interval([0.5, 0.52], [1.0, 1.001])
    assert ratio.low is not None and ratio.low < 0.5 < ratio.high


def test_one_prompt_is_measured_but_never_bounded():
    repair = rs.measure("x", [2.0], [3.0], [4.0])
    assert repair.delta_tau == rs.Interval(1.0, None, None)
    assert repair.gap_closed == rs.Interval(0.5, None, None)
    assert repair.p_value == 1.0


def test_no_share_of_a_gap_that_is_not_there():
    assert rs.measure("x", [2.0, 2.5], [2.5, 2.5], [2.0, 2.5]).gap_closed is None


def test_holm_rejects_at_its_bounds():
    assert rs.holm([0.05]) == [True]
    assert rs.holm([0.025, 0.05]) == [True, True]
    assert rs.holm([0.0250001, 0.05]) == [False, False]


def test_the_minimum_effect_is_inclusive(monkeypatch):
    monkeypatch.setattr(rs, "MIN_DELTA", 0.25)
    monkeypatch.setattr(rs, "MIN_SHARE", 0.5)
    at_both = rs.measure("x", [0.0] * 4, [0.25] * 4, [0.5] * 4)  # Δτ 0.25, half of a 0.5 gap
    assert (at_both.delta_tau.value, at_both.gap_closed.value) == (0.25, 0.5)
    assert rs.judge([at_both])[0].verdict == rs.FINDING
    below = rs.measure("x", [0.0] * 4, [0.25] * 4, [0.5000001] * 4)
    assert rs.judge([below])[0].verdict == rs.NO_EFFECT


def test_no_change_at_all_is_no_evidence():
    assert rs.rise_p_value([0.0, 0.0, 0.0]) == 1.0


def test_a_small_rise_is_no_cause_even_when_it_closes_a_small_gap():
    repair = rs.measure("x", [2.0] * 4, [2.03] * 4, [2.1] * 4)  # Δτ 0.03: 30 % of a 0.1 gap
    assert repair.gap_closed.value == pytest.approx(0.3)
    assert rs.judge([repair])[0].verdict == rs.NO_EFFECT


def test_a_judged_repair_is_recorded_with_its_intervals():
    repair = rs.judge([rs.measure("x", [2.0, 2.0], [3.0, 3.2], [3.0, 3.0])])[0]
    recorded = rs.as_dict(repair)
    assert recorded["delta_tau"] == {
        "value": repair.delta_tau.value,
        "low": repair.delta_tau.low,
        "high": repair.delta_tau.high,
    }
    assert recorded["gap_closed"]["value"] == pytest.approx(1.1)
    assert (recorded["p_value"], recorded["verdict"]) == (repair.p_value, repair.verdict)
    assert rs.as_dict_interval(None) is None


@pytest.mark.parametrize(
    ("prompts", "repairs", "expected"),
    [(8, 1, 1.894579 / math.sqrt(8)), (4, 20, 7.453319 / 2.0), (2, 1, 6.313752 / math.sqrt(2))],
)
def test_the_detectable_effect_is_holms_strictest_t_over_root_n(prompts, repairs, expected):
    # t quantiles from the tables: 0.95 at 7 and 1 df, 0.9975 at 3 df.
    assert rs.detectable_effect(prompts, repairs) == pytest.approx(expected, rel=1e-5)


def test_nothing_is_detectable_below_two_prompts_or_without_repairs():
    assert rs.detectable_effect(1, 5) is None and rs.detectable_effect(5, 0) is None
    assert rs.detectable_effect(2, 1) is not None


def test_the_prompts_needed_are_the_fewest_that_reach_the_effect():
    # One repair: 4 prompts need 1.18 SD (t 2.353 / 2), 5 need 0.95 (t 2.132 / √5).
    assert rs.prompts_needed(1) == 5
    assert rs.detectable_effect(rs.prompts_needed(20), 20) <= rs.DETECTABLE_SD
    assert rs.detectable_effect(rs.prompts_needed(20) - 1, 20) > rs.DETECTABLE_SD
    assert rs.prompts_needed(1, effect=0.5) > rs.prompts_needed(1)
    assert rs.prompts_needed(1, alpha=0.01) > rs.prompts_needed(1)
    assert rs.prompts_needed(1, effect=5.0) == 2  # t(0.95, 1 df) 6.31 / √2 = 4.46


def test_one_more_measurement_is_judged_within_the_family_already_tried():
    measured = rs.Repair("features", rs.Interval(0.4, 0.2, 0.6), rs.Interval(0.5, 0.3, 0.7), 0.02)
    assert rs.judge_within(measured, []).verdict == rs.FINDING  # alone: 0.02 < 0.05
    # with 3 tried whose p-values exceed 0.05 / 4 and 0.05 / 3, Holm keeps all four
    assert rs.judge_within(measured, [0.2, 0.3, 0.4]).verdict == rs.NO_EFFECT
    # the family's own rejections come first: 0.001 ≤ 0.05 / 2, then 0.02 ≤ 0.05 / 1
    assert rs.judge_within(measured, [0.001]).verdict == rs.FINDING
    small = rs.Repair("features", rs.Interval(0.04, 0.02, 0.06), None, 0.001)
    assert rs.judge_within(small, []).verdict == rs.NO_EFFECT  # below the minimum effect
    assert rs.judge_within(measured, []).delta_tau == measured.delta_tau


def test_a_change_the_other_drafter_gains_more_from_widens_the_gap():
    base, other = [3.0, 3.2, 2.8, 3.1], [4.0, 4.4, 4.3, 4.1]
    # the candidate +0.3 on each prompt; the other +0.6 (a block size that suits any drafter)
    shared = rs.control(base, [b + 0.3 for b in base], other, [o + 0.6 for o in other])
    assert shared.other_delta_tau.value == pytest.approx(0.6)
    assert shared.beyond_other.value == pytest.approx(-0.3) and shared.widens_gap
    # the other unchanged by it (its own mask token): the candidate's gain is all its own
    own = rs.control(base, [3.4, 3.5, 3.2, 3.3], other, other)
    assert own.other_delta_tau.value == 0.0 and not own.widens_gap
    assert own.beyond_other.low == pytest.approx(0.17265, abs=1e-5)  # 0.325 − t(3)·0.0479
    # the other gains as much, within noise: the gap as configured is still what it closes
    alike = rs.control(base, [3.6, 3.1, 3.3, 3.0], other, [o + 0.2 for o in other])
    assert alike.beyond_other.low < 0 < alike.beyond_other.high and not alike.widens_gap
    assert rs.as_dict_control(shared)["widens_gap"] is True
    assert rs.as_dict_control(own)["beyond_other"]["value"] == pytest.approx(0.325)


def test_a_control_over_prompts_that_do_not_pair_is_refused():
    with pytest.raises(ValueError):
        rs.control([3.0, 3.1], [3.2, 3.3], [4.0, 4.1], [4.2])
