"""The T > 0 interval (contract/student.py): Student's t (its tail and quantiles, shared with
diagnose's repairs) against its tables and closed forms, the ratio interval against the
textbook t interval and a hand computation, and the record built from a run's paths (prompt
means, conversations as units, the too-few warning)."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from dflash_eval.contract.student import (
    METHOD,
    MIN_UNITS,
    PathValue,
    incomplete_beta,
    prompt_interval,
    ratio_interval,
    t_critical,
    t_quantile,
    t_upper_tail,
)

# Two-sided critical values from the t table (df → level → t).
TABLE = {
    1: {0.95: 12.7062, 0.99: 63.6567, 0.5: 1.0},
    2: {0.95: 4.3027, 0.99: 9.9248, 0.5: 0.8165},
    3: {0.95: 3.1824, 0.99: 5.8409},
    4: {0.95: 2.7764, 0.99: 4.6041},
    5: {0.95: 2.5706, 0.99: 4.0321, 0.5: 0.7267},
    6: {0.95: 2.4469, 0.8: 1.4398},
    7: {0.95: 2.3646},
    10: {0.95: 2.2281, 0.99: 3.1693},
    29: {0.95: 2.0452},
    30: {0.95: 2.0423},
    120: {0.95: 1.9799},
}


@pytest.mark.parametrize(
    ("df", "level", "expected"),
    [(df, level, t) for df, row in TABLE.items() for level, t in row.items()],
)
def test_critical_values_match_the_t_table(df, level, expected):
    assert t_critical(level, df) == pytest.approx(expected, abs=6e-5)


@pytest.mark.parametrize(
    ("a", "b", "x", "expected"),
    [(2, 3, 0.5, 0.6875), (1, 1, 0.3, 0.3), (0.5, 0.5, 0.5, 0.5), (5, 0.5, 0.9, 0.316643)],
)
def test_incomplete_beta_matches_closed_forms(a, b, x, expected):
    assert incomplete_beta(a, b, x) == pytest.approx(expected, abs=1e-5)
    assert incomplete_beta(a, b, 0.0) == 0.0 and incomplete_beta(a, b, 1.0) == 1.0


@pytest.mark.parametrize(
    ("df", "quantile"), [(1, 12.7062), (3, 3.18245), (5, 2.57058), (30, 2.04227), (1e6, 1.95997)]
)
def test_t_quantiles_match_the_tables(df, quantile):
    assert t_quantile(0.975, df) == pytest.approx(quantile, rel=1e-4)
    assert t_quantile(0.025, df) == pytest.approx(-quantile, rel=1e-4)
    assert t_upper_tail(quantile, df) == pytest.approx(0.025, rel=1e-3)


def test_t_tail_is_symmetric_and_a_quantile_needs_a_probability():
    assert t_upper_tail(2.0, 10) == pytest.approx(0.036694, abs=1e-6)
    assert t_upper_tail(-2.0, 10) == pytest.approx(1 - 0.036694, abs=1e-6)
    assert t_upper_tail(0.0, 4) == pytest.approx(0.5)
    for p in (0.0, 1.0):
        with pytest.raises(ValueError, match="0 < p < 1"):
            t_quantile(p, 3)


def test_the_t_tail_matches_its_closed_forms_for_one_and_two_degrees_of_freedom():
    for t in (0.5, -0.5, 3.0):
        assert t_upper_tail(t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, abs=1e-9)
        assert t_upper_tail(t, 2) == pytest.approx(0.5 - t / (2 * math.sqrt(2 + t * t)), abs=1e-9)


def test_with_one_denominator_each_it_is_the_textbook_t_interval():
    means = [1.2, 1.55, 1.3, 1.9, 1.4, 1.35]
    found = ratio_interval(means, [1.0] * len(means))
    half = 2.570582 * statistics.stdev(means) / math.sqrt(len(means))
    assert found["value"] == pytest.approx(statistics.mean(means))
    assert found["low"] == pytest.approx(statistics.mean(means) - half)
    assert found["high"] == pytest.approx(statistics.mean(means) + half)
    narrower = ratio_interval(means, [1.0] * len(means), level=0.5)
    assert found["low"] < narrower["low"] < narrower["high"] < found["high"]


def test_a_ratio_of_sums_is_linearised():
    tokens, rounds = [30.0, 12.0, 50.0], [20.0, 10.0, 25.0]
    ratio = sum(tokens) / sum(rounds)
    residuals = [a - ratio * b for a, b in zip(tokens, rounds, strict=True)]
    se = math.sqrt(sum(e * e for e in residuals) / 6) * 3 / sum(rounds)
    found = ratio_interval(tokens, rounds)
    assert found["value"] == pytest.approx(ratio)
    assert found["high"] - found["value"] == pytest.approx(4.302653 * se)
    assert found["value"] - found["low"] == pytest.approx(4.302653 * se)


def test_two_units_have_bounds_at_one_degree_of_freedom():
    found = ratio_interval([1.0, 2.0], [1.0, 1.0])
    half = 12.706205 * statistics.stdev([1.0, 2.0]) / math.sqrt(2)
    assert found == pytest.approx({"value": 1.5, "low": 1.5 - half, "high": 1.5 + half})
    with pytest.raises(ValueError):  # one numerator and one denominator per unit
        ratio_interval([1.0, 2.0, 3.0], [1.0, 1.0])


def test_one_path_per_prompt_is_the_t_interval_over_the_paths():
    taus = [1.1, 1.4, 1.25, 1.6, 1.3]
    record = prompt_interval(_paths_each(taus), paths=1)
    assert record["tau_macro"] == ratio_interval(taus, [1.0] * 5)
    assert record["units"] == 5 and record["warning"] is None


def _paths_each(taus):
    return [v for n, tau in enumerate(taus) for v in _paths(f"p{n}", f"p{n}", tau)]


def test_one_unit_has_no_bounds_and_nothing_has_no_value():
    assert ratio_interval([1.4], [1.0]) == {"value": 1.4, "low": None, "high": None}
    assert ratio_interval([], []) is None
    assert ratio_interval([0.0, 0.0], [0.0, 0.0]) is None
    same = ratio_interval([1.5, 1.5, 1.5], [1.0, 1.0, 1.0])
    assert same == {"value": 1.5, "low": 1.5, "high": 1.5}


def _paths(prompt, unit, *taus, rounds=4.0):
    return [
        PathValue(prompt, unit, tau, (tau or 0.0) * rounds, rounds if tau else 0.0) for tau in taus
    ]


def test_the_record_averages_paths_per_prompt_and_groups_conversations():
    values = [
        *_paths("a", "a", 1.0, 2.0),  # prompt mean 1.5
        *_paths("b", "b", 1.2, None),  # a path without rounds: mean 1.2 from the other
        *_paths("c1", "c", 2.0, 2.0),  # a conversation of two turns: one unit
        *_paths("c2", "c", 1.0, 1.0),
        *_paths("d", "d", None, None),  # no rounds on any path: no unit
    ]
    record = prompt_interval(values, paths=2)
    assert record["units"] == 3 and record["paths"] == 2 and record["method"] == METHOD
    expected = ratio_interval([1.5, 1.2, 3.0], [1, 1, 2])
    assert record["tau_macro"] == expected
    assert record["tau_macro"]["value"] == pytest.approx((1.5 + 1.2 + 2.0 + 1.0) / 4)
    # Pooled: per prompt the mean over paths of tokens and of rounds, summed per unit.
    pooled = ratio_interval([6.0, 2.4, 12.0], [4.0, 2.0, 8.0])
    assert record["tau_pooled"] == pytest.approx(pooled)
    assert record["level"] == 0.95


def test_too_few_prompts_are_said_to_be_too_few():
    def record(count):
        return prompt_interval(
            [v for n in range(count) for v in _paths(str(n), str(n), 1.0 + n / 10, 1.5)], 2
        )

    assert MIN_UNITS == 5
    assert record(5)["warning"] is None and record(9)["warning"] is None
    warned = record(4)["warning"]
    assert warned.startswith("4 prompts (conversations): too few") and "at least 5" in warned
    assert record(1)["warning"].startswith("1 prompt (conversations)")
    assert record(1)["tau_macro"]["low"] is None


def test_the_interval_covers_at_its_level_where_the_percentile_bootstrap_did_not():
    """Skewed path values around prompt means spread like the audit's fixture, 6 prompts and
    4 paths: the t interval covers the prompts' true mean ~95 % of the time; the old
    percentile bootstrap over one path per prompt clearly less."""
    from dflash_eval.contract.bootstrap import Bootstrap

    rng = random.Random(7)
    centres = [1.3, 1.45, 1.5, 1.6, 1.75, 1.9]
    truth = statistics.mean(centres)

    def path(centre):  # a right-skewed τ: 1 + exponential part with the prompt's mean
        return 1 + rng.expovariate(1 / (centre - 1))

    covered = old_covered = 0
    replicates = 600
    for _ in range(replicates):
        runs = [[path(c) for _ in range(4)] for c in centres]
        found = ratio_interval([statistics.mean(r) for r in runs], [1.0] * 6)
        covered += found["low"] <= truth <= found["high"]
        single = [r[0] for r in runs]
        old = Bootstrap(6, resamples=200, seed=rng.randrange(1 << 30)).ratio(single, [1] * 6)
        old_covered += old.low <= truth <= old.high
    assert 0.925 <= covered / replicates <= 0.975  # ± 2.4 binomial s.e. around 0.95
    assert old_covered / replicates < 0.9
