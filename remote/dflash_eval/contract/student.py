"""The interval of τ at T > 0: Student-t over prompt means (stdlib only; docs/sampling.md).
In the contract because the workstation uses the same t interval: served τ against CPU τ,
paired per prompt (dflash_ops/evaluation/served_records.py, docs/served.md). Student's t itself
(its tail through the regularized incomplete beta, its quantiles) is here once, and diagnose's
repair statistics use it too.

Each prompt is walked along `--paths` sampled completions; each path gives the exact expected
τ given that path (sampled.py). A prompt's mean over its paths is an unbiased estimate of the
live loop's expected τ on that prompt, and its spread holds the path noise. The run's τ macro
is the mean of the prompt means, τ pooled Σ E[tokens] / Σ E[rounds]: both are ratios
Σ a / Σ b over units (a unit: one conversation, whose turns are not independent; a single-turn
prompt is its own). The interval is the ratio's linearised (delta-method) standard error with
Student-t's critical value at units − 1 degrees of freedom:

    R = Σ a / Σ b,  e_u = a_u − R·b_u,  se = √(Σ e_u² / (n(n − 1))) · n / Σ b,  R ± t·se

For single-turn prompts and τ macro (b = 1) this is the textbook t interval over the prompt
means. The spread of the prompt means holds both the path noise and the differences between
prompts: over a fixed prompt set it covers the live loop's mean (its many-seed figure) at
about its level or a little more (measured in docs/sampling.md), and the mean over prompts
like these at its level when the prompt means are near normal. With fewer than MIN_UNITS
units that cannot be relied on: the record carries a warning.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95
MIN_UNITS = 5  # below it a t interval rests on an untestable normality of a handful of means
METHOD = (
    "Student-t over prompt means (each the mean of its paths' exact E[τ | path]), "
    "conversations as units, ratio linearised; df = units − 1"
)


@dataclass(frozen=True)
class PathValue:
    """One walked path: its prompt, the prompt's unit, and its exact expectations."""

    prompt: str
    unit: str  # the conversation (its first turn's id)
    tau: float | None  # E[tokens / rounds] given the path; None when no round runs
    tokens: float
    rounds: float


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 400):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return fraction


def incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
        + b * math.log1p(-x)
    )  # fmt: skip
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@functools.lru_cache(maxsize=256)  # a run asks the same few (level, prompts) again and again
def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection on the tail: monotone, no starting guess)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile needs 0 < p < 1, got {p}")
    low, high = -1.0, 1.0
    while 1.0 - t_upper_tail(low, df) > p:
        low *= 2.0
    while 1.0 - t_upper_tail(high, df) < p:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if 1.0 - t_upper_tail(middle, df) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2.0


def t_critical(level: float, df: int) -> float:
    """t with P(|T| ≤ t) = level."""
    return t_quantile(0.5 + level / 2.0, df)


def ratio_interval(
    numerators: Sequence[float], denominators: Sequence[float], level: float = LEVEL
) -> dict[str, float | None] | None:
    """Σ a / Σ b over units with its t interval; None when Σ b is 0, no bounds for one unit."""
    below = sum(denominators)
    if not below:
        return None
    ratio = sum(numerators) / below
    count = len(numerators)
    if count < 2:
        return {"value": ratio, "low": None, "high": None}
    squares = sum((a - ratio * b) ** 2 for a, b in zip(numerators, denominators, strict=True))
    half = t_critical(level, count - 1) * math.sqrt(squares / (count * (count - 1))) * count / below
    return {"value": ratio, "low": ratio - half, "high": ratio + half}


def prompt_interval(values: Sequence[PathValue], paths: int, level: float = LEVEL) -> dict:
    """The `metrics.sampling.interval` record (schema_metrics.PathsInterval) of a run's paths."""
    by_prompt: dict[str, list[PathValue]] = {}
    for value in values:
        by_prompt.setdefault(value.prompt, []).append(value)
    macro: dict[str, list[float]] = {}
    pooled: dict[str, list[float]] = {}
    for walked in by_prompt.values():
        taus = [v.tau for v in walked if v.tau is not None]
        unit_macro = macro.setdefault(walked[0].unit, [0.0, 0.0])
        unit_pooled = pooled.setdefault(walked[0].unit, [0.0, 0.0])
        if taus:
            unit_macro[0] += sum(taus) / len(taus)
            unit_macro[1] += 1
        unit_pooled[0] += sum(v.tokens for v in walked) / len(walked)
        unit_pooled[1] += sum(v.rounds for v in walked) / len(walked)
    units = [unit for unit, (_, prompts) in macro.items() if prompts]
    return {
        "method": METHOD,
        "level": level,
        "paths": paths,
        "units": len(units),
        "tau_macro": ratio_interval(*_columns(macro, units), level),
        "tau_pooled": ratio_interval(*_columns(pooled, units), level),
        "warning": too_few_warning(len(units)),
    }


def _columns(sums: dict[str, list[float]], units: list[str]) -> tuple[list[float], list[float]]:
    return [sums[unit][0] for unit in units], [sums[unit][1] for unit in units]


def too_few_warning(units: int) -> str | None:
    """The warning a run with fewer than MIN_UNITS prompts (conversations) carries."""
    if units >= MIN_UNITS:
        return None
    return (
        f"{units} prompt{'s' if units != 1 else ''} (conversations): too few for a reliable "
        f"interval at T > 0 (it rests on the prompt means being near normal); use at least "
        f"{MIN_UNITS}"
    )
