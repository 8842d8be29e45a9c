"""The bootstrap intervals: coverage of a known mean on a simulated population, the seed's
determinism, and the edge cases (one unit, no unit, undefined replicates)."""

from __future__ import annotations

import random

import pytest
from dflash_eval.contract.bootstrap import Bootstrap, quantile


def population(size: int, seed: int) -> list[tuple[float, int]]:
    """Prompts as (τ, rounds): τ skewed like real per-prompt τ (most low, a long tail of
    easy prompts), rounds varying with the prompt."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(size):
        tau = 1 + min(rng.expovariate(0.6), 15.0)
        prompts.append((tau, rng.randint(5, 80)))
    return prompts


def coverage(prompts: list[tuple[float, int]], truth: float, pooled: bool) -> float:
    """How often the 95 % interval of a 40-prompt sample holds the population's value."""
    rng = random.Random(3)
    trials, hits = 600, 0
    for trial in range(trials):
        sample = rng.sample(prompts, 40)
        bootstrap = Bootstrap(len(sample), resamples=300, seed=trial)
        if pooled:
            found = bootstrap.ratio([t * r for t, r in sample], [r for _, r in sample])
        else:
            found = bootstrap.ratio([t for t, _ in sample], [1] * len(sample))
        assert found is not None and found.low is not None
        hits += found.low <= truth <= found.high
    return hits / trials


def test_intervals_cover_the_population_mean_about_95_percent_of_the_time():
    prompts = population(20_000, seed=1)
    macro = sum(t for t, _ in prompts) / len(prompts)
    # Percentile intervals from 40 prompts of a skewed population cover a little under 95 %;
    # 600 trials put the estimate within about ±3 points (three standard errors).
    assert 0.89 <= coverage(prompts, macro, pooled=False) <= 0.99


def test_pooled_intervals_cover_the_population_ratio():
    prompts = population(20_000, seed=2)
    pooled = sum(t * r for t, r in prompts) / sum(r for _, r in prompts)
    assert 0.89 <= coverage(prompts, pooled, pooled=True) <= 0.99


def test_the_same_seed_gives_the_same_interval_and_another_seed_another():
    values = [tau for tau, _ in population(50, seed=3)]
    ones = [1] * len(values)
    first = Bootstrap(len(values), seed=0).ratio(values, ones)
    again = Bootstrap(len(values), seed=0).ratio(values, ones)
    other = Bootstrap(len(values), seed=1).ratio(values, ones)
    assert first == again
    assert first is not None and other is not None
    assert first.value == other.value  # the statistic itself does not depend on the seed
    assert (first.low, first.high) != (other.low, other.high)


def test_a_wider_level_gives_a_wider_interval_around_the_value():
    values = [tau for tau, _ in population(60, seed=4)]
    ones = [1] * len(values)
    narrow = Bootstrap(len(values), level=0.5).ratio(values, ones)
    wide = Bootstrap(len(values), level=0.99).ratio(values, ones)
    assert wide.low < narrow.low < narrow.value < narrow.high < wide.high


def test_one_unit_has_a_value_but_no_interval_and_no_unit_has_neither():
    single = Bootstrap(1).ratio([3.0], [1])
    assert (single.value, single.low, single.high) == (3.0, None, None)
    assert Bootstrap(0).ratio([], []) is None


def test_replicates_where_the_statistic_is_undefined_are_left_out():
    # Two prompts, one without rounds: a resample of only that one has no pooled τ.
    found = Bootstrap(2, resamples=200).ratio([10.0, 0.0], [4, 0])
    assert found.value == found.low == found.high == 2.5


def test_quantile_interpolates_between_neighbours():
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert quantile([1.0, 2.0], 0.25) == pytest.approx(1.25)
    assert quantile([7.0], 0.975) == 7.0


def test_a_level_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="confidence level"):
        Bootstrap(3, level=95)
