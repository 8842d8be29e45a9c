"""The report's key-numbers card and its provenance (dflash_ops/ui/report.py renders them).

Provenance is every fact a run's results (and run.json) record about where its numbers come
from; the report shows the facts whose values differ between the runs side by side and folds
the ones they share. Times are shown for people: epoch seconds as UTC dates, phase seconds
as minutes and hours.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from dflash_eval.contract import reading

from dflash_ops.evaluation.compare_records import RunRecord
from dflash_ops.evaluation.compare_rows import number, ratio, run_records, tau_bounds
from dflash_ops.evaluation.results import Comparison, RunResult

# Results blocks shown as each run's provenance, in this order (bulky lists are summarised).
PROVENANCE_BLOCKS = (
    "checkpoint",
    "drafter",
    "target",
    "prompts",
    "completions",
    "harness",
    "libraries",
    "host",
    "timings_s",
    "throughput",
)
EPOCH_FACTS = {"run.started", "run.finished"}  # epoch seconds in run.json


def key_numbers(comparison: Comparison) -> list[dict[str, str]]:
    """The card at the top: the latest comparable run's numbers, each with a short note."""
    records = [r for r in run_records(comparison) if r.comparable]
    if not records:
        return []
    latest = records[-1]
    cards = [
        {
            "label": f"τ macro, step {latest.step}",
            "value": number(latest.tau_macro),
            "note": _interval_note(latest),
        }
    ]
    earlier = [r for r in records if r.step != latest.step]
    if earlier:
        before = earlier[-1]
        change = _difference(latest.tau_macro, before.tau_macro)
        cards.append(
            {
                "label": f"change from step {before.step}",
                "value": change,
                "note": _overlap_note(comparison, latest.run_id, before.run_id),
            }
        )
    if latest.best_tree is not None:
        budget = latest.best_tree_budget
        cards.append(
            {
                "label": "best DDTree τ",
                "value": number(latest.best_tree),
                "note": f"tree budget b = {budget}",
            }
        )
    first_slot = latest.acceptance.get(1)
    if first_slot is not None:
        note = "P(the first drafted token is right)"
        cards.append({"label": "acceptance at slot 1", "value": number(first_slot), "note": note})
    if latest.vs_reference:
        reference = f"reference drafter τ {number(latest.reference_tau)}"
        cards.append({"label": "vs reference", "value": ratio(latest), "note": reference})
    flagged = len(comparison.rows) - len(records)
    note = f"{flagged} not comparable (flagged)" if flagged else "all comparable"
    note += f"; comparability key {comparison.group.id}"
    cards.append({"label": "runs", "value": str(len(comparison.rows)), "note": note})
    return cards


def _interval_note(record: RunRecord) -> str:
    if not record.has_interval:
        return "no confidence interval recorded"
    if record.tau_macro_low is None:
        return "one prompt: no interval"
    return f"95 % CI {tau_bounds(record)}"


def _difference(now: float | None, before: float | None) -> str:
    return "-" if now is None or before is None else f"{now - before:+.3f}"


def _overlap_note(comparison: Comparison, latest: str, before: str) -> str:
    runs = {row.run_id: row for row in comparison.rows}
    intervals = [reading.overall_interval(runs[run_id].done) for run_id in (latest, before)]
    overlap = reading.overlaps(*intervals)
    if overlap is None:
        return "no intervals to tell it from noise"
    return (
        "within the noise (intervals overlap)" if overlap else "beyond the noise (intervals apart)"
    )


def provenance(comparison: Comparison) -> dict[str, Any]:
    """The facts that differ between the runs (a row per fact, a column per run), the ones
    every run shares, and the runs' warnings (each once, with the runs it came from)."""
    rows = comparison.rows
    facts = [run_facts(row) for row in rows]
    keys = list(dict.fromkeys(key for run in facts for key in run))
    differing, shared = [], []
    for key in keys:
        values = [run.get(key, "-") for run in facts]
        if len(rows) > 1 and len(set(values)) > 1:
            differing.append((key, values))
        else:
            shared.append((key, values[0]))
    warnings: dict[str, list[str]] = {}  # each warning once, with the runs that gave it
    for row in rows:
        for warning in row.results["warnings"] if row.results else []:
            warnings.setdefault(str(warning), []).append(row.run_id)
    return {
        "runs": [_title(row) for row in rows],
        "differing": differing,
        "shared": shared,
        "warnings": [
            (text, "every run" if len(runs) == len(rows) > 1 else ", ".join(runs))
            for text, runs in warnings.items()
        ],
    }


def run_facts(row: RunResult) -> dict[str, str]:
    """A run's provenance as dotted keys and readable values."""
    facts = {f"run.{key}": value for key, value in row.run.items()}
    for block in PROVENANCE_BLOCKS:
        facts.update(_flatten(row.results.get(block), block) if row.results else {})
    return {key: short(readable(key, value), 96) for key, value in facts.items()}


def readable(key: str, value: Any) -> Any:
    """Epoch seconds as a UTC date, phase seconds as a duration; anything else unchanged."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if key in EPOCH_FACTS:
        return utc(value)
    if key.startswith("timings_s."):
        return duration(value)
    return value


def utc(epoch: float) -> str:
    try:
        moment = datetime.fromtimestamp(epoch, timezone.utc)
    except (OverflowError, OSError, ValueError):
        return str(epoch)  # not a time this machine can show: the number as recorded
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float) -> str:
    """'0.42 s', '12.3 s', '3 min 05 s', '2 h 04 min'."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def _title(row: RunResult) -> str:
    step = f"{row.training_run} step {row.step}" if row.training_run else f"step {row.step}"
    return f"{row.run_id} ({step})"


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    """Nested dicts as dotted keys; lists of records summarised by their length."""
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flatten(inner, f"{prefix}.{key}"))
        return flat
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        return {prefix: f"({len(value)} entries: see results.json)"}
    return {prefix: value}


def short(value: Any, limit: int = 24) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
