"""Percentile bootstrap confidence intervals over prompts (stdlib only).

A statistic of a run (τ macro, τ pooled, an acceptance rate) is a function of its prompts.
Resampling the prompts with replacement and recomputing the statistic shows how much it
would move with other prompts of the same kind: the interval holds the central `level` of
those replicates (the percentile method). The resamples are drawn once per group from
`random.Random(seed)` and shared by every statistic of that group, so the intervals of one
run are reproducible bit for bit and consistent with each other.

Units are what is resampled: one prompt, or one conversation whose turns are prompts of
their own (MT-Bench): turns of one conversation are not independent, so they are drawn
together (a cluster bootstrap). Every statistic here is a ratio of sums over units
(Σ numerator / Σ denominator): a mean over prompts is Σ τ / Σ 1, τ pooled is Σ committed
tokens / Σ rounds, an acceptance rate Σ hits / Σ trials.

A single unit has no spread to resample: its interval has no bounds (null), rather than a
zero-width one that would look certain.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

Item = TypeVar("Item")

RESAMPLES = 2000
SEED = 0
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    value: float  # the statistic on the units as they are
    low: float | None  # None: too few units to say
    high: float | None

    def as_dict(self) -> dict[str, float | None]:
        return {"value": self.value, "low": self.low, "high": self.high}


class Bootstrap:
    """`resamples` draws of `count` unit indices with replacement, drawn once."""

    def __init__(
        self, count: int, *, resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL
    ) -> None:
        if not 0 < level < 1:
            raise ValueError(f"confidence level must be in (0, 1), got {level}")
        self.count = count
        self.level = level
        rng = random.Random(seed)
        indices = range(count)
        self.samples = [rng.choices(indices, k=count) for _ in range(resamples if count else 0)]

    def interval(self, statistic: Callable[[Sequence[int]], float | None]) -> Interval | None:
        """The statistic of the units (given as indices) with its interval; None when it is
        undefined on the data itself. Replicates where it is undefined are left out."""
        value = statistic(range(self.count))
        if value is None:
            return None
        if self.count < 2:
            return Interval(value, None, None)
        replicates = sorted(r for r in map(statistic, self.samples) if r is not None)
        if not replicates:
            return Interval(value, value, value)
        tail = (1 - self.level) / 2
        return Interval(value, quantile(replicates, tail), quantile(replicates, 1 - tail))

    def ratio(self, numerators: Sequence[float], denominators: Sequence[float]) -> Interval | None:
        """Σ numerators / Σ denominators over the units (one value of each per unit)."""

        def statistic(indices: Sequence[int]) -> float | None:
            below = sum(map(denominators.__getitem__, indices))
            return sum(map(numerators.__getitem__, indices)) / below if below else None

        return self.interval(statistic)

    def ratio_of_parts(
        self, units: Sequence[Sequence[Item]], part: Callable[[Item], tuple[float, float]]
    ) -> Interval | None:
        """`ratio` of per-unit sums: `part` gives each item's (numerator, denominator)."""
        parts = [[part(item) for item in unit] for unit in units]
        return self.ratio(
            [sum(above for above, _ in unit) for unit in parts],
            [sum(below for _, below in unit) for unit in parts],
        )


def quantile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, interpolating linearly between neighbours."""
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)
