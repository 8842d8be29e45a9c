"""Metrics per named prompt set and overall, each with a bootstrap confidence interval.

Computed from the results' per-prompt rows alone (docs/results-schema.md, `by_dataset`), so
the same numbers can be recomputed from any results file. Stdlib only. Prompts without
rounds are left out, as in `metrics`:

- τ macro: mean over prompts of each prompt's τ; τ pooled: Σ committed tokens / Σ rounds
  (committed = τ × rounds of each prompt);
- DDTree τ macro per budget;
- conditional acceptance per block position: Σ hits / Σ trials over the prompts.

Units resampled are conversations (a multi-turn conversation's turns travel together): each
statistic is a ratio of per-conversation sums (bootstrap.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dflash_eval import schema
from dflash_eval.bootstrap import LEVEL, RESAMPLES, SEED, Bootstrap

Row = dict[str, Any]


def acceptance_counts(slot_correct: Sequence[Sequence[bool]]) -> dict[str, list[int]]:
    """Per position k = 1..: rounds where slots < k were all right and slot k was checked
    (trials), and those where slot k was right too (hits): the conditional rate's parts."""
    longest = max((len(slots) for slots in slot_correct), default=0)
    hits, trials = [0] * longest, [0] * longest
    for slots in slot_correct:
        for k, correct in enumerate(slots):
            trials[k] += 1
            if not correct:
                break
            hits[k] += 1
    return {schema.HITS: hits, schema.TRIALS: trials}


def intervals(
    per_prompt: Sequence[Row],
    budgets: Sequence[int | str],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> dict[str, Any]:
    """The results' `by_dataset` block: every prompt, then each named set on its own."""
    names = sorted({row.get(schema.PROMPT_DATASET) for row in per_prompt} - {None})
    budget_keys = [str(b) for b in budgets]

    def group(rows: Sequence[Row]) -> dict[str, Any]:
        units = conversations(rows)
        bootstrap = Bootstrap(len(units), resamples=resamples, seed=seed, level=level)
        return {
            schema.GROUP_PROMPTS: len(rows),
            schema.GROUP_UNITS: len(units),
            **_statistics(bootstrap, units, budget_keys),
        }

    return {
        schema.BOOTSTRAP: {
            "method": "percentile",
            "unit": "conversation",
            "resamples": resamples,
            "seed": seed,
            "level": level,
        },
        schema.OVERALL: group(per_prompt),
        schema.DATASETS: {
            name: group([row for row in per_prompt if row.get(schema.PROMPT_DATASET) == name])
            for name in names
        },
    }


def conversations(rows: Sequence[Row]) -> list[list[Row]]:
    """The rows with rounds, grouped by conversation in first-seen order (a row without a
    conversation is its own)."""
    grouped: dict[str, list[Row]] = {}
    for row in rows:
        if row[schema.ROUNDS]:
            key = row.get(schema.PROMPT_CONVERSATION) or row[schema.PROMPT_ID]
            grouped.setdefault(key, []).append(row)
    return list(grouped.values())


def _statistics(bootstrap: Bootstrap, units: list[list[Row]], budgets: list[str]) -> dict[str, Any]:
    def ratio(part: Callable[[Row], tuple[float, float]]) -> dict[str, float] | None:
        parts = [[part(row) for row in unit] for unit in units]
        found = bootstrap.ratio(
            [sum(above for above, _ in unit) for unit in parts],
            [sum(below for _, below in unit) for unit in parts],
        )
        return found.as_dict() if found else None

    positions = max(
        (len(row[schema.PROMPT_ACCEPTANCE][schema.TRIALS]) for unit in units for row in unit),
        default=0,
    )
    return {
        schema.ROUNDS: sum(row[schema.ROUNDS] for unit in units for row in unit),
        schema.TAU_MACRO: ratio(lambda row: (row[schema.PROMPT_TAU], 1)),
        schema.TAU_POOLED: ratio(
            lambda row: (row[schema.PROMPT_TAU] * row[schema.ROUNDS], row[schema.ROUNDS])
        ),
        schema.DDTREE: {
            b: {
                schema.TAU_MACRO: ratio(
                    lambda row, b=b: _present(row[schema.PROMPT_DDTREE_TAU].get(b))
                )
            }
            for b in budgets
        },
        schema.PER_POSITION: [
            {
                schema.POSITION: k + 1,
                schema.CONDITIONAL: ratio(lambda row, k=k: _position(row, k)),
            }
            for k in range(positions)
        ],
    }


def _present(value: float | None) -> tuple[float, float]:
    """(value, 1) to average a value that may be missing, (0, 0) when it is."""
    return (0.0, 0.0) if value is None else (value, 1.0)


def _position(row: Row, k: int) -> tuple[float, float]:
    counts = row[schema.PROMPT_ACCEPTANCE]
    if k >= len(counts[schema.TRIALS]):
        return (0.0, 0.0)
    return (counts[schema.HITS][k], counts[schema.TRIALS][k])
