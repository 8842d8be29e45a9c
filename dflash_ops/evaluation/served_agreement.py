"""Whether served and CPU τ agree, and on what: the CPU τ in SGLang's count, the settings both
must share, and the paired per-prompt test. Stdlib only (with the harness's contract).

SGLang counts a request's acceptance as completion tokens / verification steps, the
completion's first token (from the prefill) included, the steps those of z-lab's current loop:
the CPU harness's `zlab-07ebd93` convention (`metrics.capped`), whose committed tokens are the
completion tokens − 1. So the CPU figure in SGLang's count is, per prompt,
completion_tokens · tau_capped / (completion_tokens − 1) (rounds_capped = (completion − 1) /
tau_capped); macro over prompts, pooled Σ completion / Σ rounds, each with the interval the
served τ has (the bootstrap over conversations, computed alike). At T = 0 on the same prompts
it equals the served τ unless features or numerics differ (docs/served.md).

Whether they agree is a paired test: both sides are exact per prompt, so the per-prompt
differences served − CPU (matched by prompt id) carry no sampling noise of their own; their
mean over prompts gets the Student-t interval of contract/student.py (conversations as
units), and the two disagree when it excludes 0 and the mean is at least MIN_EFFECT. Records
without per-prompt values to pair fall back to the overlap of the two 95 % intervals, a more
lenient test, and say so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any

from dflash_eval.contract.bootstrap import Bootstrap
from dflash_eval.contract.schema import Results
from dflash_eval.contract.schema_served import ServedResults
from dflash_eval.contract.student import ratio_interval

MIN_EFFECT = 0.05  # τ: a smaller mean served − CPU difference is not called a disagreement
PAIRED = "paired"  # the per-prompt differences' t interval
OVERLAP = "overlap"  # no per-prompt values to pair: the two intervals' overlap


def in_sglangs_count(results: Results) -> dict[str, dict[str, float | None]] | None:
    """The CPU τ of a run in SGLang's count, macro and pooled, each with the interval the
    served τ has: the percentile bootstrap over conversations (contract/bootstrap.py, the
    same resamples, seed and level), a ratio of per-conversation sums as `served-eval`
    computes it (None: no prompt has a round)."""
    units: dict[str, list[tuple[int, float]]] = {}
    for row, tokens, rounds in _counted(results):
        units.setdefault(_unit(row), []).append((tokens, rounds))
    if not units:
        return None
    groups = list(units.values())
    bootstrap = Bootstrap(len(groups))

    def ratio(part: Callable[[tuple[int, float]], tuple[float, float]]) -> dict[str, float | None]:
        found = bootstrap.ratio_of_parts(groups, part)
        assert found is not None  # every unit has a round
        return found.as_dict()

    return {
        "tau_macro": ratio(lambda row: (row[0] / row[1], 1)),
        "tau_pooled": ratio(lambda row: row),
    }


def _counted(results: Results) -> list[tuple[Mapping[str, Any], int, float]]:
    """Each CPU prompt with a round: its row, its completion tokens and its rounds in SGLang's
    count (those of `zlab-07ebd93`: the committed tokens, completion − 1, over τ capped)."""
    return [
        (row, row["completion_tokens"], (row["completion_tokens"] - 1) / row["tau_capped"])
        for row in results["per_prompt"]
        if row["tau_capped"] and row["completion_tokens"] > 1
    ]


def _unit(row: Mapping[str, Any]) -> str:
    """The prompt's conversation (its first turn's id; its own id for a single turn)."""
    return row.get("conversation") or row["id"]


def paired_difference(results: Results, served: ServedResults) -> dict[str, Any] | None:
    """Served τ − the CPU τ in SGLang's count, prompt by prompt (matched by id, both with a
    round), as a mean over the prompts with the Student-t interval of contract/student.py
    (conversations as units, whose turns are not independent); None when no prompt pairs."""
    cpu = {row["id"]: tokens / rounds for row, tokens, rounds in _counted(results)}
    units: dict[str, list[float]] = {}
    for row in served["per_prompt"]:
        if row["tau"] is not None and row["id"] in cpu:
            units.setdefault(_unit(row), []).append(row["tau"] - cpu[row["id"]])
    if not units:
        return None
    differences = list(units.values())
    interval = ratio_interval([sum(d) for d in differences], [len(d) for d in differences])
    assert interval is not None  # every unit holds a prompt
    return {**interval, "prompts": sum(map(len, differences)), "units": len(differences)}


def agreement(
    results: Results,
    served: ServedResults,
    cpu_macro: dict[str, float | None],
    served_macro: dict[str, float | None],
) -> dict[str, Any]:
    """Whether served and CPU τ agree, and by which test (`test`): paired per prompt (they
    disagree when the difference's 95 % interval excludes 0 and |mean| >= MIN_EFFECT), or,
    without per-prompt values to pair, the overlap of the two macro intervals; with the
    paired difference (`delta_*`, None without one) and how many prompts it pairs."""
    delta = paired_difference(results, served)
    if delta is None:
        return {
            "agree": overlap(cpu_macro, served_macro),
            "test": OVERLAP,
            **dict.fromkeys(("delta_tau", "delta_low", "delta_high")),
            "paired_prompts": 0,
        }
    return {
        "agree": not disagrees(delta),
        "test": PAIRED,
        "delta_tau": delta["value"],
        "delta_low": delta["low"],
        "delta_high": delta["high"],
        "paired_prompts": delta["prompts"],
    }


def disagrees(delta: Mapping[str, Any]) -> bool:
    """The paired test's verdict on the mean served − CPU difference: its 95 % interval
    excludes 0 and the mean is at least MIN_EFFECT (an interval without bounds, from one
    conversation, cannot tell)."""
    low, high = delta["low"], delta["high"]
    if low is None or high is None:
        return False
    return (low > 0 or high < 0) and abs(delta["value"]) >= MIN_EFFECT


def overlap(one: dict[str, float | None], other: dict[str, float | None]) -> bool:
    """Whether two intervals (value, low, high) agree: they overlap; where one has no
    bounds (a single conversation), its value lies in the other's."""

    def bounds(interval: dict[str, float | None]) -> tuple[float, float]:
        value, low, high = interval["value"], interval["low"], interval["high"]
        assert value is not None
        return (value, value) if low is None or high is None else (low, high)

    (low, high), (other_low, other_high) = bounds(one), bounds(other)
    unbounded = one["low"] is None and other["low"] is None
    return unbounded or (low <= other_high and other_low <= high)


def same_settings(results: Results, served: ServedResults) -> bool:
    """The CPU run and the served record measured the same thing. The target is compared by
    its directory's name: the GPU host and the eval host may keep it under other paths, but a
    served record of another model must never be paired with a CPU run."""
    prompts, settings = results["prompts"], served["settings"]
    return (
        PurePosixPath(served["server"]["target"]).name == results["target"]["name"]
        and prompts["sha256"] == settings["prompts_sha256"]
        and prompts["max_new_tokens"] == settings["max_new_tokens"]
        and (prompts.get("thinking", "off") == "on") == settings["thinking"]
        and results["metrics"]["block_size"] == served["server"]["num_draft_tokens"]
        and "sampling" not in results["metrics"]
    )
