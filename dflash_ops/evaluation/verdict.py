"""The line a run, each step of a sweep and each step of a watch pass end with: what to act
on, in the glossary's words (README.md) — τ macro with its 95 % interval, the change from the
previous comparable step of the same training run (beyond the prompt-to-prompt noise when
the two intervals are apart, within it when they overlap), the ratio to the reference
drafter, and the comparability key the run joins (reading.key_id).

Read from the pulled results, after the pull: the previous step is the nearest earlier step
whose run has the same comparability key (the latest such run when a step was evaluated
twice), so a run with other settings is never measured against a step it cannot be
compared with.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dflash_eval.contract import reading
from rich.markup import escape

from dflash_ops.evaluation.results import RunResult, load_runs

# the glossary's reading of two 95 % intervals (README.md): apart, a real change
NOISE = {None: "no intervals to judge noise", True: "within noise", False: "beyond noise"}


def previous_comparable(runs: Sequence[RunResult], row: RunResult) -> RunResult | None:
    """The run of the nearest earlier step with `row`'s training run and comparability key."""
    if row.step is None:
        return None
    earlier = [
        other
        for other in runs
        if other.results is not None
        and other.step is not None
        and other.step < row.step
        and other.training_run == row.training_run
        and other.key_id == row.key_id
    ]
    return max(earlier, key=lambda r: (r.step, r.run.get("started") or 0), default=None)


def verdict(runs: Sequence[RunResult], row: RunResult) -> str:
    """'τ 1.849 [1.739, 1.955], +0.814 vs step 2000 (beyond noise), 0.62× reference, key
    k3f9a1b2c' for a successful run among the pulled `runs`."""
    interval = reading.overall_interval(row.done)
    tau = row.metrics["tau_macro"]
    parts = [f"τ {reading.format_interval(interval)}" if interval else f"τ {tau:.3f} [no CI]"]
    before = previous_comparable(runs, row)
    if before is None:
        parts.append("first comparable step")
    else:
        overlap = reading.overlaps(interval, reading.overall_interval(before.done))
        change = tau - before.metrics["tau_macro"]
        parts.append(f"{change:+.3f} vs step {before.step} ({NOISE[overlap]})")
    ratio = (row.done["comparison"] or {}).get("tau_macro")
    if ratio:
        parts.append(f"{ratio:.2f}× reference")
    elif row.done["reference"]:
        parts.append("no ratio to reference (other block size)")
    else:
        parts.append("no reference")
    parts.append(f"key {row.key_id}")
    return ", ".join(parts)


def verdicts(results_root: Path, run_ids: Sequence[str]) -> dict[str, str]:
    """The verdict of each of `run_ids` that is pulled and succeeded, by run id."""
    runs = load_runs(results_root)
    return {
        row.run_id: verdict(runs, row)
        for row in runs
        if row.run_id in run_ids and row.results is not None
    }


def closing_line(results_root: Path, run_id: str) -> str | None:
    """'step 4000: <verdict>' for a pulled successful run, as markup-safe text (a reporter's
    line); None when it has no results."""
    runs = load_runs(results_root)
    row = next((r for r in runs if r.run_id == run_id and r.results is not None), None)
    return None if row is None else escape(f"step {row.step}: {verdict(runs, row)}")
