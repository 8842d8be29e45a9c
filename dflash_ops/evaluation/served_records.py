"""Served τ beside CPU τ: the served records `fab served-eval` pulled
(`local.results/served/ID/served.json`), each set beside the CPU runs of the same step and
the same settings (served_agreement.same_settings), whether the two agree
(served_agreement.py), and how compare, the report and diagnose show it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.schema_served import ServedResults, parse_served, served_key

from dflash_ops.evaluation.groups import RunGroup, group_runs
from dflash_ops.evaluation.results import RunResult, load_runs
from dflash_ops.evaluation.served_agreement import (
    MIN_EFFECT,
    OVERLAP,
    agreement,
    in_sglangs_count,
    same_settings,
)

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
                **agreement(cpu.done, record, cpu_macro, dict(macro)),
            }
        )
    return rows


def disagreement_finding(row: dict[str, Any], rank: int) -> dict[str, Any]:
    """diagnose's finding for a row whose served and CPU τ disagree, saying by which test."""
    return {
        "rank": rank,
        "area": "served",
        "title": "served and CPU τ disagree: features or numerics differ",
        "evidence": (
            f"step {row['step']}: SGLang served τ {shown(row, 'served')} (run "
            f"{row['served_run']}), the CPU harness {shown(row, 'cpu')} in SGLang's count (run "
            f"{row['cpu_run']}, same prompts and settings): {verdict(row)}"
        ),
        "check_next": (
            "compare the target's features on the GPU with the CPU's (fab extract-features on "
            "the features host, then run-eval --features), the target dtype, and the drafter "
            "config SGLang read (fab export-drafter's config.json)"
        ),
    }


def verdict(row: dict[str, Any]) -> str:
    """The test a side-by-side row was judged by, and what it found, as a sentence."""
    if row["test"] == OVERLAP:
        found = "do not overlap" if not row["agree"] else "overlap"
        return (
            f"the two 95 % intervals {found} (the records carry no per-prompt values to pair, "
            "so the lenient overlap test was used)"
        )
    found = (
        f"it excludes 0 and reaches the minimum effect of {MIN_EFFECT} τ"
        if not row["agree"]
        else f"within the noise or under the minimum effect of {MIN_EFFECT} τ"
    )
    return (
        f"paired over {row['paired_prompts']} prompts, served − CPU = {delta_shown(row)} "
        f"(Student-t 95 %): {found}"
    )


def delta_shown(row: dict[str, Any]) -> str:
    """The mean per-prompt difference served − CPU with its interval, signed ("–": none)."""
    if row["delta_tau"] is None:
        return "–"
    low, high = row["delta_low"], row["delta_high"]
    bounds = "" if low is None or high is None else f" [{low:+.3f}, {high:+.3f}]"
    return f"{row['delta_tau']:+.3f}{bounds}"


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


def group_title(group: RunGroup[ServedRun], groups: int) -> str:
    """A served group's heading: its key's id and the settings its runs share."""
    key = group.key
    return (
        f"served runs, key {group.id} (group {group.number} of {groups}): "
        f"{key['target']}, B={key['num_draft_tokens']}, {key['prompts']} prompts, "
        f"max_new_tokens {key['max_new_tokens']}, thinking {'on' if key['thinking'] else 'off'}"
    )


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
    "served − CPU per prompt [95% CI]",
    "agree",
    "test",
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
            delta_shown(row),
            "yes" if row["agree"] else "≠ no",
            judged_by(row),
            row["served_run"],
        ]
        for row in rows
    ]


def judged_by(row: dict[str, Any]) -> str:
    """Which test judged a row, in a few words."""
    if row["test"] == OVERLAP:
        return "interval overlap (no per-prompt values)"
    return f"paired t, {row['paired_prompts']} prompts, |Δ| ≥ {MIN_EFFECT}"


def served_findings(
    results_root: Path, step: int, findings: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`fab diagnose`'s finding for each served record of `step` whose served τ and the CPU τ
    of the same settings disagree (`agreement`), ranked after `findings`."""
    rows = side_by_side(load_runs(results_root), load_served(results_root))
    wrong = [row for row in rows if row["step"] == step and not row["agree"]]
    return [disagreement_finding(row, len(findings) + i) for i, row in enumerate(wrong, 1)]
