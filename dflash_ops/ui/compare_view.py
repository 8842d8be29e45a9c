"""What `fab compare` and `dflash-ops results compare` print, and `fab export` writes.

The default table is compact (step, training run, host, short id, τ with its 95 % interval,
the best DDTree τ, acceptance at slot 1, against the reference, the training run's own metrics at
the step where its inventory names a metrics log, comparability) and fits the
terminal; `--wide` shows the complete table (as the report has it). Per-set results are in
long form: a row per run × prompt set × metric, the tidy table `fab export` writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from dflash_ops.core.errors import OpsError
from dflash_ops.core.files import write_atomic
from dflash_ops.evaluation import compare_rows, served_records, training_metrics
from dflash_ops.evaluation.groups import RunGroup
from dflash_ops.evaluation.results import Comparison
from dflash_ops.evaluation.served_records import ServedRun
from dflash_ops.ui.output import Column, as_csv, as_json, field, render

# τ as the glossary defines it (README.md): what a round commits, its accepted tokens + 1
TITLE = "comparison (τ: tokens per round, accepted + 1, macro over prompts; tree: DDTree τ)"
SETS_TITLE = "per prompt set (95 % bootstrap intervals over prompts)"
EXPORT_FORMATS = {".csv": as_csv, ".json": as_json}


def _tau_with_interval(record: dict[str, Any]) -> str:
    if record["tau_macro"] is None:
        return "-"
    bounds = compare_rows.bounds_of(record, "tau_macro")
    return f"{record['tau_macro']:.3f}" + ("" if bounds == "-" else f" {bounds}")


def _best_tree(record: dict[str, Any]) -> str:
    if record["best_tree"] is None:
        return "-"
    return f"{record['best_tree']:.3f} @{record['best_tree_budget']}"


def compact_columns(comparison: Comparison) -> list[Column]:
    """The default table's columns; `keep` orders what a narrow terminal loses first."""
    rows = comparison.rows
    columns = [Column("step", field("step"), keep=9, right=True)]
    if any(row.training_run for row in rows):
        columns.append(
            Column("run", lambda r: r["training_run"] or compare_rows.DEFAULT_RUN, keep=5)
        )
    columns += [
        Column("host", field("host"), keep=2),
        Column("id", field("short_id"), keep=8),
        Column("τ [95% CI]", _tau_with_interval, keep=10, right=True),
    ]
    if comparison.budgets:
        columns.append(Column("best tree", _best_tree, keep=7, right=True))
    columns.append(
        Column("acc@1", lambda r: compare_rows.number(r.get("acc_1")), keep=6, right=True)
    )
    if any(row.done["reference"] for row in rows):
        columns.append(Column("vs ref", compare_rows.ratio, keep=4, right=True))
    # the training run's own metrics at the step, beside τ (training_metrics)
    trained = training_metrics.columns(row.training for row in rows)
    columns += [Column(title, show, keep=4, right=True) for title, show in trained]
    if comparison.mixed:
        columns.append(Column("comparable", _comparable, keep=3))
    return columns


def _comparable(record: dict[str, Any]) -> str:
    return "yes" if record["comparable"] else f"≠ {record['differs']}"


def wide_columns(comparison: Comparison) -> list[Column]:
    """Every column of the complete table (the report's)."""
    left = ("run", compare_rows.TRAINING_RUN, "host", "comparable")
    return [
        Column(title, show, right=title not in left)
        for title, show in compare_rows.table_columns(comparison)
    ]


def set_columns(wide: bool) -> list[Column]:
    columns = [
        Column("step", field("step"), keep=9, right=True),
        Column("id", field("short_id"), keep=8),
        Column("prompt set", field("prompt_set"), keep=10),
        Column("prompts", field("prompts"), keep=3, right=True),
    ]
    if wide:
        columns.append(Column("metric", field("metric")))
    columns.append(Column("value [95% CI]", _value_with_interval, keep=10, right=True))
    return columns


def _value_with_interval(record: dict[str, Any]) -> str:
    if record["value"] is None:
        return "-"
    if record["low"] is None:
        return f"{record['value']:.3f}"
    return f"{record['value']:.3f} [{record['low']:.3f}, {record['high']:.3f}]"


def print_comparison(comparison: Comparison, fmt: str, wide: bool, console: Console) -> None:
    """The runs' table and their per-set results, in `fmt` (one JSON document for json;
    CSV: the runs only, `fab export` writes the per-set table)."""
    records = compare_rows.run_records(comparison)
    sets = compare_rows.set_records(comparison)
    if fmt == "json":
        document = {"runs": records, "groups": group_records(comparison), "per_set": sets}
        console.print(json.dumps(document, indent=2), markup=False, soft_wrap=True)
        return
    if fmt == "csv":
        render(records, [], fmt, console=console)
        return
    columns = wide_columns(comparison) if wide else compact_columns(comparison)

    def flagged(record: dict[str, Any]) -> str | None:
        return None if record["comparable"] else "red"

    render(records, columns, fmt, console=console, title=TITLE, wide=wide, style=flagged)
    if fmt == "table":
        console.print(key_line(comparison))
    if not wide:  # the compact per-set table: τ macro of each set
        sets = [record for record in sets if record["metric"] == "tau_macro"]
    if any(record["low"] is not None for record in sets):
        if fmt == "markdown":
            console.print()
        render(sets, set_columns(wide), fmt, console=console, title=SETS_TITLE, wide=wide)


SERVED_TITLE = "served τ beside CPU τ (SGLang's count: " + served_records.MATCHING + ")"


def print_served(rows: list[dict[str, Any]], fmt: str, console: Console) -> None:
    """`fab compare`'s served table, when served records match its runs (served_records)."""
    if not rows:
        return
    if fmt == "json":
        console.print(json.dumps({"served": rows}, indent=2), markup=False, soft_wrap=True)
        return
    header = served_records.SERVED_HEADER
    records = [dict(zip(header, cells, strict=True)) for cells in served_records.served_cells(rows)]
    columns = [Column(title, field(title), keep=len(header) - i) for i, title in enumerate(header)]
    render(records, columns, fmt, console=console, title=SERVED_TITLE)


def print_served_groups(groups: list[RunGroup[ServedRun]], fmt: str, console: Console) -> None:
    """`fab compare`'s served runs among themselves: a table per comparability group of
    served records (served_records.served_groups), its steps in order."""
    if not groups:
        return
    if fmt == "json":
        found = [
            {
                "group": group.number,
                "comparability_key": group.id,
                "settings": group.key,
                "runs": [{"run": item.run_id, **item.record["served"]} for item in group.rows],
            }
            for group in groups
        ]
        console.print(json.dumps({"served_groups": found}, indent=2), markup=False, soft_wrap=True)
        return
    header = served_records.SERVED_RUNS_HEADER
    columns = [Column(title, field(title), keep=len(header) - i) for i, title in enumerate(header)]
    for group in groups:
        key = group.key
        title = (
            f"served runs, key {group.id} (group {group.number} of {len(groups)}): "
            f"{key['target']}, B={key['num_draft_tokens']}, {key['prompts']} prompts, "
            f"max_new_tokens {key['max_new_tokens']}, thinking {'on' if key['thinking'] else 'off'}"
        )
        cells = served_records.served_run_cells(group)
        records = [dict(zip(header, row, strict=True)) for row in cells]
        render(records, columns, fmt, console=console, title=title)


def key_line(comparison: Comparison) -> str:
    """Which comparability key the table shows: the name its runs carry in every export."""
    group = comparison.group
    of = f" of {len(comparison.groups)}" if len(comparison.groups) > 1 else ""
    return f"comparability key {group.id}: group {group.number}{of}, {len(group.rows)} run(s)"


def group_records(comparison: Comparison) -> list[dict[str, Any]]:
    return [
        {
            "group": group.number,
            "comparability_key": group.id,
            "compared": group.number == comparison.compared,
            "runs": [row.run_id for row in group.rows],
            "differs": group.differs,
        }
        for group in comparison.groups
    ]


def export(comparison: Comparison, out: Path) -> int:
    """Write the tidy per-set table (CSV or JSON, by `out`'s suffix); the rows written."""
    write = EXPORT_FORMATS.get(out.suffix.lower())
    if write is None:
        raise OpsError(
            f"--out {out}: expected a .csv or .json file name, found suffix {out.suffix!r}"
        )
    records = compare_rows.set_records(comparison)
    write_atomic(out, write(records, []), make_parents=False)
    return len(records)
