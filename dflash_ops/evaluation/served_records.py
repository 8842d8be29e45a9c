"""Served τ beside CPU τ: the served records `fab served-eval` pulled
(`local.results/served/ID/served.json`), each set beside the CPU runs of the same step and
the same settings (prompts by their sha256, max_new_tokens, thinking, block size).

SGLang counts a request's acceptance as completion tokens / verification steps, the
completion's first token (from the prefill) included, the steps those of z-lab's current loop:
the CPU harness's `zlab-07ebd93` convention (`metrics.capped`), whose committed tokens are the
completion tokens − 1. So the CPU figure in SGLang's count is, per prompt,
completion_tokens · tau_capped / (completion_tokens − 1) (rounds_capped = (completion − 1) /
tau_capped); macro over prompts, pooled Σ completion / Σ rounds, each with the interval the
served τ has (the bootstrap over conversations, computed alike). At T = 0 on the same prompts
it equals the served τ unless features or numerics differ (docs/served.md); two 95 %
intervals that do not overlap are a disagreement.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from dflash_eval.contract.bootstrap import Bootstrap
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.schema import Results
from dflash_eval.contract.schema_served import ServedResults, parse_served, served_key

from dflash_ops.evaluation.groups import RunGroup, group_runs
from dflash_ops.evaluation.results import RunResult, load_runs

SERVED_DIR = "served"  # under local.results
MATCHING = "the CPU harness's zlab-07ebd93 rounds, the prefill's token counted (SGLang's count)"


@dataclass(frozen=True)
class ServedRun:
    run_id: str
    record: ServedResults


def load_served(results_root: Path) -> list[ServedRun]:
    """Every readable served record under results_root/served (an unreadable one is left out)."""
    found = []
    for path in sorted((results_root / SERVED_DIR).glob("*/served.json")):
        try:
            found.append(ServedRun(path.parent.name, parse_served(json.loads(path.read_text()))))
        except (OSError, ValueError, HarnessError):
            continue
    return found


def served_groups(served: list[ServedRun]) -> list[RunGroup[ServedRun]]:
    """The served records split by their own comparability key (schema_served.served_key):
    served runs are compared only among themselves, largest group first, by step."""
    ordered = sorted(served, key=lambda item: (item.record["step"] or 0, item.run_id))
    return group_runs(
        ordered,
        lambda item: served_key(item.record),
        lambda item: datetime.fromisoformat(item.record["created_at"]).timestamp(),
    )


def in_sglangs_count(results: Results) -> dict[str, dict[str, float | None]] | None:
    """The CPU τ of a run in SGLang's count, macro and pooled, each with the interval the
    served τ has: the percentile bootstrap over conversations (contract/bootstrap.py, the
    same resamples, seed and level), a ratio of per-conversation sums as `served-eval`
    computes it (None: no prompt has a round)."""
    units: dict[str, list[tuple[int, float]]] = {}
    for row in results["per_prompt"]:
        if row["tau_capped"] and row["completion_tokens"] > 1:
            rounds = (row["completion_tokens"] - 1) / row["tau_capped"]
            key = row.get("conversation") or row["id"]
            units.setdefault(key, []).append((row["completion_tokens"], rounds))
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
    prompts, settings = results["prompts"], served["settings"]
    return (
        prompts["sha256"] == settings["prompts_sha256"]
        and prompts["max_new_tokens"] == settings["max_new_tokens"]
        and (prompts.get("thinking", "off") == "on") == settings["thinking"]
        and results["metrics"]["block_size"] == served["server"]["num_draft_tokens"]
        and "sampling" not in results["metrics"]
    )


def side_by_side(runs: list[RunResult], served: list[ServedRun]) -> list[dict[str, Any]]:
    """A row per served record with a CPU run of the same step and settings (the newest)."""
    rows = []
    for item in served:
        record = item.record
        matching = [
            run
            for run in runs
            if run.results is not None
            and run.step == record["step"]
            and same_settings(run.done, record)
        ]
        if not matching:
            continue
        cpu = matching[-1]
        counted = in_sglangs_count(cpu.done)
        macro = record["served"]["tau_macro"]
        if counted is None or macro is None:
            continue
        cpu_macro = counted["tau_macro"]
        rows.append(
            {
                "step": record["step"],
                "cpu_run": cpu.run_id,
                "served_run": item.run_id,
                "cpu_tau_macro": cpu.metrics["tau_macro"],
                "cpu_tau_sglang_count": cpu_macro["value"],
                "cpu_low": cpu_macro["low"],
                "cpu_high": cpu_macro["high"],
                "served_tau_macro": macro["value"],
                "served_low": macro["low"],
                "served_high": macro["high"],
                "agree": overlap(cpu_macro, dict(macro)),
            }
        )
    return rows


def disagreement_finding(row: dict[str, Any], rank: int) -> dict[str, Any]:
    """diagnose's finding for a row whose CPU and served intervals do not overlap."""
    return {
        "rank": rank,
        "area": "served",
        "title": "served and CPU τ disagree: features or numerics differ",
        "evidence": (
            f"step {row['step']}: SGLang served τ {shown(row, 'served')} (run "
            f"{row['served_run']}), the CPU harness {shown(row, 'cpu')} in SGLang's count (run "
            f"{row['cpu_run']}, same prompts and settings): the 95 % intervals do not overlap"
        ),
        "check_next": (
            "compare the target's features on the GPU with the CPU's (fab extract-features on "
            "the features host, then run-eval --features), the target dtype, and the drafter "
            "config SGLang read (fab export-drafter's config.json)"
        ),
    }


def with_bounds(interval: Mapping[str, float | None] | None) -> str:
    """An interval record as text: its value, then its bounds where it has them."""
    if interval is None:
        return "–"
    low, high = interval["low"], interval["high"]
    bounds = "" if low is None or high is None else f" [{low:.3f}, {high:.3f}]"
    return f"{interval['value']:.3f}{bounds}"


def shown(row: dict[str, Any], side: str) -> str:
    """A side's τ in SGLang's count with its interval ("cpu" or "served")."""
    value = row["cpu_tau_sglang_count" if side == "cpu" else "served_tau_macro"]
    return with_bounds({"value": value, "low": row[f"{side}_low"], "high": row[f"{side}_high"]})


SERVED_RUNS_HEADER = [
    "step",
    "served τ macro [95% CI]",
    "served τ pooled [95% CI]",
    "verification steps",
    "served run",
]


def served_run_cells(group: RunGroup[ServedRun]) -> list[list[str]]:
    """One served group's runs as text, under SERVED_RUNS_HEADER, by step."""
    return [
        [
            "–" if item.record["step"] is None else str(item.record["step"]),
            with_bounds(item.record["served"]["tau_macro"]),
            with_bounds(item.record["served"]["tau_pooled"]),
            str(item.record["served"]["verify_steps"]),
            item.run_id,
        ]
        for item in group.rows
    ]


SERVED_HEADER = [
    "step",
    "CPU τ (live loop)",
    "CPU τ in SGLang's count [95% CI]",
    "served τ [95% CI]",
    "agree",
    "served run",
]


def served_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The side-by-side rows as text, under SERVED_HEADER (terminal and report alike)."""

    return [
        [
            str(row["step"]),
            f"{row['cpu_tau_macro']:.3f}",
            shown(row, "cpu"),
            shown(row, "served"),
            "yes" if row["agree"] else "≠ no",
            row["served_run"],
        ]
        for row in rows
    ]


def served_findings(
    results_root: Path, step: int, findings: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`fab diagnose`'s finding for each served record of `step` whose served τ and the CPU τ
    of the same settings disagree (their intervals do not overlap), ranked after `findings`."""
    rows = side_by_side(load_runs(results_root), load_served(results_root))
    wrong = [row for row in rows if row["step"] == step and not row["agree"]]
    return [disagreement_finding(row, len(findings) + i) for i, row in enumerate(wrong, 1)]
