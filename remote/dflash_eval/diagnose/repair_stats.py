"""How much of a τ gap one repair closes, with intervals that hold for a handful of prompts,
and which repairs may be called findings when many are tried at once. Stdlib only.

A repair is the candidate drafter re-evaluated with one setting changed, on the same prompts
as the candidate and the other drafter. Per prompt i: `base_i` (the candidate's τ),
`repaired_i` and `other_i`. Then
- Δτ = mean(repaired − base), with a Student-t interval on the paired differences and a
  one-sided p-value for "the repair raises τ";
- gap closed = mean(repaired − base) / mean(other − base), a ratio of two correlated means,
  with Fieller's interval (exact under normality of the per-prompt differences; unbounded
  when the gap itself is not told apart from zero, and then reported as unknown);
- across the repairs tried, Holm's step-down rule keeps the family-wise error at `alpha`;
  a repair is a finding only when Holm rejects *and* its effect is at least the minimum
  (`MIN_DELTA` of τ and `MIN_SHARE` of the gap): anything smaller is "no measurable effect".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from dflash_eval.contract.student import t_quantile, t_upper_tail

LEVEL = 0.95
ALPHA = 0.05
MIN_DELTA = 0.05  # τ: a smaller change is noise on any real prompt set
MIN_SHARE = 0.10  # of the gap
# Below this many standard deviations of a repair's per-prompt change, a prompt set can tell
# a repair from noise: a set that cannot reach it cannot rule repairs out.
DETECTABLE_SD = 1.0
FINDING = "finding"
NO_EFFECT = "no measurable effect"


@dataclass(frozen=True)
class Interval:
    value: float
    low: float | None  # None: not bounded at this level (too few prompts, or no gap)
    high: float | None


@dataclass(frozen=True)
class Repair:
    """One repair measured: Δτ, the share of the gap it closes, and its verdict."""

    name: str
    delta_tau: Interval
    gap_closed: Interval | None  # None: the candidate is not behind the other drafter
    p_value: float
    verdict: str = NO_EFFECT


# --- intervals ---------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _covariance(x: Sequence[float], y: Sequence[float]) -> float:
    mx, my = _mean(x), _mean(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / (len(x) - 1)


def mean_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """The mean with its Student-t interval (unbounded below two values)."""
    mean = _mean(values)
    if len(values) < 2:
        return Interval(mean, None, None)
    half = t_quantile(0.5 + level / 2.0, len(values) - 1) * math.sqrt(
        _covariance(values, values) / len(values)
    )
    return Interval(mean, mean - half, mean + half)


def rise_p_value(differences: Sequence[float]) -> float:
    """One-sided p-value of the paired t-test for "the mean difference is above zero"."""
    n, mean = len(differences), _mean(differences)
    if n < 2:
        return 1.0
    spread = math.sqrt(_covariance(differences, differences) / n)
    if spread == 0.0:
        return 0.0 if mean > 0 else 1.0
    return t_upper_tail(mean / spread, n - 1)


def ratio_interval(
    numerator: Sequence[float], denominator: Sequence[float], level: float = LEVEL
) -> Interval:
    """mean(numerator) / mean(denominator), paired per prompt, with Fieller's interval: the
    ratios R whose paired residual numerator − R·denominator has a mean the t-test keeps."""
    n = len(numerator)
    a, b = _mean(numerator), _mean(denominator)
    ratio = a / b
    if n < 2:
        return Interval(ratio, None, None)
    t2 = t_quantile(0.5 + level / 2.0, n - 1) ** 2
    s_aa = _covariance(numerator, numerator) / n
    s_bb = _covariance(denominator, denominator) / n
    s_ab = _covariance(numerator, denominator) / n
    quadratic = b * b - t2 * s_bb
    if quadratic <= 0.0:  # the denominator's mean is not told apart from zero
        return Interval(ratio, None, None)
    linear = a * b - t2 * s_ab
    constant = a * a - t2 * s_aa
    root = math.sqrt(max(linear * linear - quadratic * constant, 0.0))
    return Interval(ratio, (linear - root) / quadratic, (linear + root) / quadratic)


# --- many repairs at once -----------------------------------------------------------------


def measure(
    name: str, base: Sequence[float], repaired: Sequence[float], other: Sequence[float]
) -> Repair:
    """One repair against the candidate (`base`) and the other drafter, per prompt."""
    if not len(base) == len(repaired) == len(other) > 0:
        raise ValueError(
            f"{name}: per-prompt τ of unequal lengths or none "
            f"({len(base)}, {len(repaired)}, {len(other)})"
        )
    delta = [r - b for r, b in zip(repaired, base, strict=True)]
    gap = [o - b for o, b in zip(other, base, strict=True)]
    closed = ratio_interval(delta, gap) if _mean(gap) > 0 else None
    return Repair(name, mean_interval(delta), closed, rise_p_value(delta))


@dataclass(frozen=True)
class Control:
    """A repair's change made to the other drafter too: its Δτ, and the candidate's Δτ beyond
    it (paired per prompt). `widens_gap`: the other gains measurably more, so the change made
    to both leaves the candidate further behind: it suits the target and prompts, and cannot
    be what sets the candidate apart. (A change the other gains as much from stays a repair:
    the gap as configured is what a repair closes.)"""

    other_delta_tau: Interval
    beyond_other: Interval
    widens_gap: bool


def control(
    base: Sequence[float],
    repaired: Sequence[float],
    other: Sequence[float],
    other_changed: Sequence[float],
) -> Control:
    """The candidate's change per prompt against the other drafter's under the same change."""
    theirs = [c - o for c, o in zip(other_changed, other, strict=True)]
    beyond = [r - b - t for r, b, t in zip(repaired, base, theirs, strict=True)]
    difference = mean_interval(beyond)
    widens = difference.high is not None and difference.high < 0
    return Control(mean_interval(theirs), difference, widens)


def holm(p_values: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Which hypotheses Holm's step-down procedure rejects, family-wise error `alpha`."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for rank, index in enumerate(order):
        if p_values[index] > alpha / (len(p_values) - rank):
            break
        rejected[index] = True
    return rejected


def _large_enough(repair: Repair) -> bool:
    if repair.delta_tau.value < MIN_DELTA:
        return False
    return repair.gap_closed is None or repair.gap_closed.value >= MIN_SHARE


def judge(repairs: Sequence[Repair], alpha: float = ALPHA) -> list[Repair]:
    """The repairs with their verdicts, findings first by the lower bound of the gap they
    close (an unbounded one last), then the rest by Δτ."""
    rejected = holm([repair.p_value for repair in repairs], alpha)
    judged = [_judged(r, significant) for r, significant in zip(repairs, rejected, strict=True)]

    def order(repair: Repair) -> tuple:
        closed = repair.gap_closed
        low = closed.low if closed is not None and closed.low is not None else -math.inf
        return (repair.verdict != FINDING, -low, -repair.delta_tau.value)

    return sorted(judged, key=order)


def judge_within(measured: Repair, family: Sequence[float], alpha: float = ALPHA) -> Repair:
    """One more measurement judged as a repair, with Holm's correction over the family of
    p-values already tried and its own."""
    return _judged(measured, holm([*family, measured.p_value], alpha)[-1])


def _judged(repair: Repair, significant: bool) -> Repair:
    """The repair with its verdict: a finding when Holm rejected and the effect is large
    enough."""
    verdict = FINDING if significant and _large_enough(repair) else NO_EFFECT
    return dataclasses.replace(repair, verdict=verdict)


def detectable_effect(prompts: int, repairs: int, alpha: float = ALPHA) -> float | None:
    """The smallest observed effect, in standard deviations of a repair's per-prompt change,
    that can be called a finding at all with this many prompts and repairs: the one-sided t
    at Holm's strictest threshold alpha / repairs, over √prompts. None below two prompts or
    without repairs (nothing can be judged)."""
    if prompts < 2 or repairs < 1:
        return None
    return t_quantile(1.0 - alpha / repairs, prompts - 1) / math.sqrt(prompts)


def prompts_needed(repairs: int, alpha: float = ALPHA, effect: float = DETECTABLE_SD) -> int:
    """The fewest prompts with which an effect of `effect` standard deviations can count."""
    prompts = 2
    while (detectable_effect(prompts, repairs, alpha) or math.inf) > effect:
        prompts += 1
    return prompts


def as_dict_interval(value: Interval | None) -> dict | None:
    return None if value is None else {"value": value.value, "low": value.low, "high": value.high}


def as_dict(repair: Repair) -> dict:
    """A judged repair as the diagnosis records it (JSON)."""
    return {
        "delta_tau": as_dict_interval(repair.delta_tau),
        "gap_closed": as_dict_interval(repair.gap_closed),
        "p_value": repair.p_value,
        "verdict": repair.verdict,
    }


def as_dict_control(measured: Control) -> dict:
    """A control as the diagnosis records it (JSON)."""
    return {
        "other_delta_tau": as_dict_interval(measured.other_delta_tau),
        "beyond_other": as_dict_interval(measured.beyond_other),
        "widens_gap": measured.widens_gap,
    }
