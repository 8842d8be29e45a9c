"""Metrics per named prompt set and overall, each with a bootstrap confidence interval.

Computed from the results' per-prompt rows alone (docs/results-schema.md, `by_dataset`), so
the same numbers can be recomputed from any results file. Stdlib only. Prompts without
rounds are left out, as in `metrics`:

- τ macro: mean over prompts of each prompt's τ; τ pooled: Σ committed tokens / Σ rounds
  (committed = τ × rounds of each prompt);
- DDTree τ macro per budget;
- conditional acceptance per block position: Σ hits / Σ trials over the prompts.

Units resampled are conversations (a multi-turn conversation's turns travel together): each
statistic is a ratio of per-conversation sums (contract/bootstrap.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dflash_eval.contract.bootstrap import LEVEL, RESAMPLES, SEED, Bootstrap
from dflash_eval.contract.schema_metrics import Acceptance, ByDataset, Group, Interval, PromptRow

Row = PromptRow


def acceptance_counts(slot_correct: Sequence[Sequence[bool]]) -> Acceptance:
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
    return Acceptance(hits=hits, trials=trials)


def intervals(
    per_prompt: Sequence[Row],
    budgets: Sequence[int | str],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> ByDataset:
    """The results' `by_dataset` block: every prompt, then each named set on its own."""
    names = sorted({row.get("dataset") for row in per_prompt} - {None})
    budget_keys = [str(b) for b in budgets]

    def group(rows: Sequence[Row]) -> Group:
        units = conversations(rows)
        bootstrap = Bootstrap(len(units), resamples=resamples, seed=seed, level=level)
        return Group(
            prompts=len(rows), units=len(units), **_statistics(bootstrap, units, budget_keys)
        )

    return {
        "bootstrap": {
            "method": "percentile",
            "unit": "conversation",
            "resamples": resamples,
            "seed": seed,
            "level": level,
        },
        "overall": group(per_prompt),
        "datasets": {
            name: group([row for row in per_prompt if row.get("dataset") == name]) for name in names
        },
    }


def conversations(rows: Sequence[Row]) -> list[list[Row]]:
    """The rows with rounds, grouped by conversation in first-seen order (a row without a
    conversation is its own)."""
    grouped: dict[str, list[Row]] = {}
    for row in rows:
        if row["rounds"]:
            key = row.get("conversation") or row["id"]
            grouped.setdefault(key, []).append(row)
    return list(grouped.values())


def _statistics(bootstrap: Bootstrap, units: list[list[Row]], budgets: list[str]) -> dict[str, Any]:
    def ratio(part: Callable[[Row], tuple[float, float]]) -> Interval | None:
        found = bootstrap.ratio_of_parts(units, part)
        return found.as_dict() if found else None

    positions = max(
        (len(row["acceptance"]["trials"]) for unit in units for row in unit),
        default=0,
    )
    return {
        "rounds": sum(row["rounds"] for unit in units for row in unit),
        "tau_macro": ratio(lambda row: (row["tau"], 1)),
        "tau_pooled": ratio(lambda row: (row["tau"] * row["rounds"], row["rounds"])),
        "ddtree": {
            b: {"tau_macro": ratio(lambda row, b=b: _present(row["ddtree_tau"].get(b)))}
            for b in budgets
        },
        "per_position": [
            {
                "position": k + 1,
                "conditional": ratio(lambda row, k=k: _position(row, k)),
            }
            for k in range(positions)
        ],
    }


def _present(value: float | None) -> tuple[float, float]:
    """(value, 1) to average a value that may be missing, (0, 0) when it is."""
    return (0.0, 0.0) if value is None else (value, 1.0)


def _position(row: Row, k: int) -> tuple[float, float]:
    counts = row["acceptance"]
    if k >= len(counts["trials"]):
        return (0.0, 0.0)
    return (counts["hits"][k], counts["trials"][k])
