"""Served τ beside CPU τ: the served records `fab served-eval` pulled
(`local.results/served/ID/served.json`), each set beside the CPU runs of the same step and
the same settings (prompts by their sha256, max_new_tokens, thinking, block size).

SGLang counts a request's acceptance as completion tokens / verification steps, the
completion's first token (from the prefill) included, the steps those of z-lab's current loop:
the CPU harness's `zlab-07ebd93` convention (`metrics.capped`), whose committed tokens are the
completion tokens − 1. So the CPU figure in SGLang's count is, per prompt,
completion_tokens · tau_capped / (completion_tokens − 1) (rounds_capped = (completion − 1) /
tau_capped); macro over prompts, pooled Σ completion / Σ rounds. At T = 0 on the same prompts
it equals the served τ unless features or numerics differ (docs/served.md); a CPU figure
outside the served τ's 95 % interval is a disagreement.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.schema import Results
from dflash_eval.contract.schema_served import ServedResults, parse_served

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


def in_sglangs_count(results: Results) -> dict[str, float] | None:
    """The CPU τ of a run in SGLang's count: macro and pooled (None: no prompt has a round)."""
    rows = [
        (row["completion_tokens"], (row["completion_tokens"] - 1) / row["tau_capped"])
        for row in results["per_prompt"]
        if row["tau_capped"] and row["completion_tokens"] > 1
    ]
    if not rows:
        return None
    return {
        "tau_macro": sum(tokens / rounds for tokens, rounds in rows) / len(rows),
        "tau_pooled": sum(t for t, _ in rows) / sum(r for _, r in rows),
    }


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
        low, high = macro["low"], macro["high"]
        agree = low is None or high is None or low <= counted["tau_macro"] <= high
        rows.append(
            {
                "step": record["step"],
                "cpu_run": cpu.run_id,
                "served_run": item.run_id,
                "cpu_tau_macro": cpu.metrics["tau_macro"],
                "cpu_tau_sglang_count": counted["tau_macro"],
                "served_tau_macro": macro["value"],
                "served_low": low,
                "served_high": high,
                "agree": agree,
            }
        )
    return rows


def disagreement_finding(row: dict[str, Any], rank: int) -> dict[str, Any]:
    """diagnose's finding for a row whose CPU figure lies outside the served interval."""
    return {
        "rank": rank,
        "area": "served",
        "title": "served and CPU τ disagree: features or numerics differ",
        "evidence": (
            f"step {row['step']}: SGLang served τ {row['served_tau_macro']:.3f} "
            f"[{row['served_low']:.3f}, {row['served_high']:.3f}] (run {row['served_run']}), "
            f"the CPU harness {row['cpu_tau_sglang_count']:.3f} in SGLang's count (run "
            f"{row['cpu_run']}, same prompts and settings)"
        ),
        "check_next": (
            "compare the target's features on the GPU with the CPU's (fab extract-features on "
            "the features host, then run-eval --features), the target dtype, and the drafter "
            "config SGLang read (fab export-drafter's config.json)"
        ),
    }


SERVED_HEADER = [
    "step",
    "CPU τ (live loop)",
    "CPU τ in SGLang's count",
    "served τ [95% CI]",
    "agree",
    "served run",
]


def served_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The side-by-side rows as text, under SERVED_HEADER (terminal and report alike)."""

    def interval(row: dict[str, Any]) -> str:
        low, high = row["served_low"], row["served_high"]
        bounds = "" if low is None or high is None else f" [{low:.3f}, {high:.3f}]"
        return f"{row['served_tau_macro']:.3f}{bounds}"

    return [
        [
            str(row["step"]),
            f"{row['cpu_tau_macro']:.3f}",
            f"{row['cpu_tau_sglang_count']:.3f}",
            interval(row),
            "yes" if row["agree"] else "≠ no",
            row["served_run"],
        ]
        for row in rows
    ]


def served_findings(
    results_root: Path, step: int, findings: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`fab diagnose`'s finding for each served record of `step` whose served τ and the CPU τ
    of the same settings disagree beyond the served interval, ranked after `findings`."""
    rows = side_by_side(load_runs(results_root), load_served(results_root))
    wrong = [row for row in rows if row["step"] == step and not row["agree"]]
    return [disagreement_finding(row, len(findings) + i) for i, row in enumerate(wrong, 1)]
