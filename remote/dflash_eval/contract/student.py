"""The interval of τ at T > 0: Student-t over prompt means (stdlib only; docs/sampling.md).
In the contract because the workstation uses the same t interval: served τ against CPU τ,
paired per prompt (dflash_ops/evaluation/served_records.py, docs/served.md).

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


def t_two_sided(t: float, df: int) -> float:
    """P(|T| ≤ t) for Student's T with `df` ≥ 1 degrees of freedom (t ≥ 0), in closed form
    (Abramowitz & Stegun 26.7.3–4)."""
    theta = math.atan(t / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    if df % 2:  # odd: (2/π)(θ + sin θ cos θ Σ_k c_k cos^2k θ)
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= cos2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin θ Σ_k c_k cos^2k θ
    for k in range(1, df // 2):
        term *= cos2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def t_critical(level: float, df: int) -> float:
    """t with P(|T| ≤ t) = level (bisection on the closed form: exact to 1e-12)."""
    low, high = 0.0, 1.0
    while t_two_sided(high, df) < level:
        high *= 2
    while high - low > 1e-12 * high:
        middle = (low + high) / 2
        if t_two_sided(middle, df) < level:
            low = middle
        else:
            high = middle
    return (low + high) / 2


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
