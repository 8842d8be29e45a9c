"""The rows behind `fab compare` and `fab export`: each run of a comparison as a record (JSON,
CSV, export rows, W&B) and as table cells, per run and per prompt set, and the notes on
consecutive steps whose intervals overlap. What is compared, and with what, is results.py's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from dflash_eval.contract import reading
from dflash_eval.contract.reading import groups
from dflash_eval.contract.schema_metrics import Interval

from dflash_ops.evaluation import training_metrics
from dflash_ops.evaluation.results import Comparison, RunResult
from dflash_ops.evaluation.run_ids import short_ids

POSITIONS_SHOWN = (1, 2, 4, 8, 15)  # those inside the block are shown
TRAINING_RUN = "training run"  # the column shown when some row belongs to a named run
DEFAULT_RUN = "-"  # how that column shows the trainer's own checkpoints


def run_records(comparison: Comparison) -> list[dict[str, Any]]:
    """One record per compared run: plain values (None where a run has none), the keys of
    `fab compare --format json|csv`; the tables format them (`table_rows`, the UI's)."""
    block = max(row.metrics["block_size"] for row in comparison.rows)
    positions = [k for k in POSITIONS_SHOWN if k < block]
    ids = short_ids(row.run_id for row in comparison.rows)
    trained = training_metrics.fields_of(row.training for row in comparison.rows)
    records = []
    for row in comparison.rows:
        metrics = row.metrics
        per_position = reading.conditional_by_position(metrics)
        interval = reading.overall_interval(row.done)
        trees = {b: reading.ddtree_tau(metrics, b) for b in comparison.budgets}
        best = max((b for b in trees if trees[b] is not None), key=lambda b: trees[b], default=None)
        reference = row.done["reference"]
        differing = comparison.differences.get(row.run_id)
        records.append(
            {
                **_identity(row, ids),
                "group": comparison.group_of(row.run_id),
                "comparable": not differing,
                "differs": ", ".join(differing) if differing else None,
                "tau_macro": metrics["tau_macro"],
                "has_interval": interval is not None,
                "tau_macro_low": interval["low"] if interval else None,
                "tau_macro_high": interval["high"] if interval else None,
                "tau_pooled": metrics["tau_pooled"],
                **{f"tree_{b}": tau for b, tau in trees.items()},
                "best_tree": trees[best] if best else None,
                "best_tree_budget": int(best) if best else None,
                **{f"acc_{k}": per_position.get(k) for k in positions},
                "reference_tau": reference["metrics"]["tau_macro"] if reference else None,
                "vs_reference": (row.done["comparison"] or {}).get("tau_macro"),
                **training_metrics.record_values(row.training, trained),
            }
        )
    return records


def _identity(row: RunResult, ids: dict[str, str]) -> dict[str, Any]:
    """What names a run in a record: ids, training run, step, host, tag, and the short name
    of its comparability key (the same in every export, however many runs are added)."""
    return {
        "run_id": row.run_id,
        "short_id": ids[row.run_id],
        "training_run": row.training_run,
        "step": row.step,
        "host": row.run.get("host"),
        "tag": row.tag,
        "comparability_key": row.key_id,
    }


def table_columns(comparison: Comparison) -> list[tuple[str, Callable[[dict], str]]]:
    """The complete comparison table (`--wide`, the report): each column's title and how it
    shows a run record."""
    rows = comparison.rows
    block = max(row.metrics["block_size"] for row in rows)
    with_intervals = any(row.done.get("by_dataset") for row in rows)
    columns: list[tuple[str, Callable[[dict], str]]] = [("run", lambda r: r["run_id"])]
    if any(row.training_run for row in rows):
        columns.append((TRAINING_RUN, lambda r: r["training_run"] or DEFAULT_RUN))
    columns += [
        ("step", lambda r: str(r["step"])),
        ("host", lambda r: r["host"] or "?"),
        ("τ macro", _shown("tau_macro")),
        ("τ pooled", _shown("tau_pooled")),
    ]
    if with_intervals:
        columns.append(("τ macro 95% CI", lambda r: bounds_of(r, "tau_macro")))
    columns += [(f"tree-{b}", _shown(f"tree_{b}")) for b in comparison.budgets]
    columns += [(f"acc@{k}", _shown(f"acc_{k}")) for k in POSITIONS_SHOWN if k < block]
    if any(row.done["reference"] for row in rows):
        columns += [("ref τ", _shown("reference_tau")), ("vs ref", ratio)]
    columns += training_metrics.columns(row.training for row in rows)
    columns.append(("comparable", lambda r: "≠ " + r["differs"] if r["differs"] else "yes"))
    return columns


def table_rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the complete comparison table."""
    columns = table_columns(comparison)
    cells = [[show(record) for _, show in columns] for record in run_records(comparison)]
    return [title for title, _ in columns], cells


def _shown(key: str) -> Callable[[dict], str]:
    return lambda record: number(record.get(key))


def ratio(record: dict) -> str:
    """The run's τ macro over its reference drafter's."""
    return f"{record['vs_reference']:.2f}×" if record.get("vs_reference") else "-"


def bounds_of(record: dict, key: str) -> str:
    """A run record's interval of `key` as '[low, high]' ('-': none recorded)."""
    low, high = record.get(f"{key}_low"), record.get(f"{key}_high")
    if not record.get("has_interval"):
        return "-"
    return "[1 unit]" if low is None else f"[{low:.3f}, {high:.3f}]"


def number(value: float | None) -> str:
    """A metric as the tables show it."""
    return "-" if value is None else f"{value:.3f}"


def _bounds(interval: Interval | None) -> str:
    if not interval:
        return "-"
    if interval["low"] is None:
        return "[1 unit]"  # a single prompt (or conversation) gives no interval
    return f"[{interval['low']:.3f}, {interval['high']:.3f}]"


def _with_interval(interval: Interval | None) -> str:
    return "-" if not interval else f"{interval['value']:.3f} {_bounds(interval)}"


ACCEPTANCE_IN_SETS = (1, 2)  # positions shown in the per-set table (the rest: the JSON)


def dataset_rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the per-prompt-set table: each run's every prompt, then each of
    its named sets, with 95 % intervals (runs from before intervals are left out)."""
    with_runs = any(row.training_run for row in comparison.rows)
    header = ["run", *[TRAINING_RUN] * with_runs, "step", "prompt set", "prompts"]
    header += ["τ macro [95% CI]", "τ pooled [95% CI]"]
    header += [f"tree-{b} [95% CI]" for b in comparison.budgets]
    header += [f"acc@{k} [95% CI]" for k in ACCEPTANCE_IN_SETS]
    cells = []
    for row in comparison.rows:
        for name, group in groups(row.done).items():
            conditional = {p["position"]: p["conditional"] for p in group["per_position"]}
            cells.append(
                [
                    row.run_id,
                    *[row.training_run or DEFAULT_RUN] * with_runs,
                    str(row.step),
                    name,
                    str(group["prompts"]),
                    _with_interval(group["tau_macro"]),
                    _with_interval(group["tau_pooled"]),
                    *(
                        _with_interval(reading.ddtree_interval(group, b))
                        for b in comparison.budgets
                    ),
                    *(_with_interval(conditional.get(k)) for k in ACCEPTANCE_IN_SETS),
                ]
            )
    return header, cells


def set_records(comparison: Comparison) -> list[dict[str, Any]]:
    """The tidy form (`fab export`, compare's per-set table): one record per run × prompt
    set × metric, with its 95 % interval and its `comparability_key` (only rows of one key
    may be put side by side; the groups' display numbers are not in it). A run from before
    intervals gives its overall metrics under ALL_PROMPTS, without bounds."""
    ids = short_ids(row.run_id for row in comparison.rows)
    records = []
    for row in comparison.rows:
        common = _identity(row, ids)
        for name, prompts, metric, interval in _set_metrics(row, comparison.budgets):
            low, high = (interval["low"], interval["high"]) if interval else (None, None)
            records.append(
                {
                    **common,
                    "prompt_set": name,
                    "prompts": prompts,
                    "metric": metric,
                    "value": interval["value"] if interval else None,
                    "low": low,
                    "high": high,
                }
            )
    return records


def _set_metrics(
    row: RunResult, budgets: list[str]
) -> Iterator[tuple[str, int, str, Interval | None]]:
    """(prompt set, prompts, metric, its interval) of every metric of every set of a run."""
    sets = groups(row.done)
    if not sets:  # results from before intervals: the overall values, unbounded
        metrics = row.metrics
        prompts = row.done["prompts"]["count"]
        values = {"tau_macro": metrics["tau_macro"], "tau_pooled": metrics["tau_pooled"]}
        values |= {f"tree_{b}": reading.ddtree_tau(metrics, b) for b in budgets}
        conditional = reading.conditional_by_position(metrics)
        values |= {f"acc_{k}": conditional.get(k) for k in ACCEPTANCE_IN_SETS}
        for metric, value in values.items():
            bound = None if value is None else Interval(value=value, low=None, high=None)
            yield reading.ALL_PROMPTS, prompts, metric, bound
        return
    for name, group in sets.items():
        conditional = {p["position"]: p["conditional"] for p in group["per_position"]}
        yield name, group["prompts"], "tau_macro", group["tau_macro"]
        yield name, group["prompts"], "tau_pooled", group["tau_pooled"]
        for b in budgets:
            yield name, group["prompts"], f"tree_{b}", reading.ddtree_interval(group, b)
        for k in ACCEPTANCE_IN_SETS:
            yield name, group["prompts"], f"acc_{k}", conditional.get(k)


def overlap_notes(comparison: Comparison) -> list[str]:
    """For each pair of consecutive comparable runs (by step, within one training run), and
    each prompt set they share: do their τ macro intervals overlap? Disjoint 95 % intervals
    mean a real change; overlapping ones mean these prompts cannot tell the two apart."""
    rows = [
        row
        for row in comparison.rows
        if row.run_id not in comparison.differences and row.done.get("by_dataset")
    ]
    notes = []
    for before, after in itertools.pairwise(rows):
        if before.training_run != after.training_run:
            continue  # another training run's steps: not a change of this one
        first, second = groups(before.done), groups(after.done)
        for name in [n for n in first if n in second]:
            a, b = first[name]["tau_macro"], second[name]["tau_macro"]
            verdict = reading.overlaps(a, b)
            if verdict is None:
                continue  # a set with one prompt (or conversation) has no interval to compare
            run = f"{before.training_run} " if before.training_run else ""
            notes.append(
                f"{run}step {before.step} → {after.step}, {name}: τ macro {_with_interval(a)} → "
                f"{_with_interval(b)}: "
                + (
                    "intervals overlap: not distinguishable from prompt-to-prompt noise"
                    if verdict
                    else "intervals do not overlap: a change beyond prompt-to-prompt noise"
                )
            )
    return notes
