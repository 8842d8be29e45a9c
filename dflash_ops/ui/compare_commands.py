"""The result tasks' front doors (`fab compare`, `export`, `report`, and `dflash-ops results
compare`, `export`, `report`): each reads the pulled runs through dflash_ops.evaluation.results,
shows them with the compare views, and writes only what it is asked to (plots, the export,
the HTML report).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflash_eval.contract.summary import sample_lines
from rich.console import Console

from dflash_ops.core.arguments import parse_steps
from dflash_ops.evaluation import compare_rows, figures, results, served_records
from dflash_ops.evaluation.groups import RunGroup, parse_group
from dflash_ops.evaluation.served_records import ServedRun
from dflash_ops.ui import report, report_diagnosis
from dflash_ops.ui.compare_view import export, print_comparison, print_served, print_served_groups
from dflash_ops.ui.console import console, errors, shown
from dflash_ops.ui.output import parse_format

EXPORT_NAME = "export.csv"  # fab export's file under the results directory


def show_comparison(
    results_root: Path,
    steps: str | None = None,
    tag: str | None = None,
    allow_mixed: bool = False,
    plots: Path | None = None,
    samples: bool = False,
    training_run: str | None = None,
    *,
    fmt: str = "table",
    wide: bool = False,
    group: int | str | None = None,
    baseline: str | None = None,
    train_metric: str | None = None,
    with_report: bool = False,
) -> results.Comparison:
    """`fab compare` / `dflash-ops results compare`: the runs of one comparability group
    (the largest, `group`: its number or key as typed, or `baseline`'s) in a table that
    fits the terminal (`wide`: the complete one) or as `fmt`; the other groups, named;
    per-set results with confidence intervals and whether consecutive steps' overlap. It
    reads only, unless asked: the plots into `plots`, and (`with_report`) the HTML report
    (rewritten, every selected run in it, those of other groups flagged). `allow_mixed`
    shows the other groups' runs in the table too, flagged. Runs of several training runs
    are grouped and labelled by run; `training_run` keeps one."""
    fmt = parse_format(fmt)
    every = results.compare(
        results.load_runs(results_root),
        parse_steps(steps),
        tag,
        training_run,
        parse_group(group),
        baseline,
    )
    within = every.within()  # nothing left when every run is flagged: show them, flagged
    comparison = every if allow_mixed or not within.rows else within
    # Anything but the table goes to stdout alone, for a program to read; notes to stderr.
    notes = console if fmt == "table" else errors
    print_comparison(comparison, fmt, wide, console)
    served_runs = served_records.load_served(results_root)
    served = served_records.side_by_side(every.rows, served_runs)
    served_groups = served_records.served_groups(served_runs)
    print_served(served, fmt, notes)
    print_served_groups(served_groups, fmt, notes)
    _print_notes(every, comparison, notes)
    if samples:
        _print_samples(comparison, notes)
    for plot in figures.plot(comparison, plots, train_metric) if plots else []:
        notes.print(f"plot: {shown(plot)}")
    if with_report:
        path = results_root / report.REPORT_NAME
        path = _written_report(every, path, results_root, train_metric, served, served_groups)
        notes.print(f"report: {shown(path)}")
    elif not plots and fmt == "table":
        notes.print("[dim]plots and the HTML report: add --plots and --report[/]")
    return comparison


def _print_notes(every: results.Comparison, comparison: results.Comparison, notes: Console) -> None:
    """Why runs are not in the table, or are flagged in it: the other comparability groups,
    each run not comparable, each run skipped; then which steps' intervals overlap."""
    for line in results.group_lines(every):
        notes.print(f"[yellow]{shown(line)}[/]")
    for run in (run for run in every.rows if run.flag):
        notes.print(
            f"[yellow]not comparable[/] {shown(run.run_id)} ({_step_of(run)}): {shown(run.flag)}"
        )
    for run in every.skipped:
        why = run.problem or f"{run.run.get('state', 'not successful')}, no results"
        notes.print(f"[yellow]skipped[/] {shown(run.run_id)} ({_step_of(run)}): {shown(why)}")
    for note in compare_rows.overlap_notes(comparison):
        notes.print(shown(note))


def _print_samples(comparison: results.Comparison, notes: Console) -> None:
    for run in comparison.rows:
        lines = sample_lines(run.done) or ["(no decoded samples in this run)"]
        notes.print(f"[bold]{shown(run.run_id)}[/] ({_step_of(run)}):")
        for line in lines:  # each a line: a newline in a prompt id would fake one
            notes.print(f"  {shown(line)}")


def _step_of(run: results.RunResult) -> str:
    """The run's step, with its training run's name (as markup)."""
    return f"{shown(run.training_run)} step {run.step}" if run.training_run else f"step {run.step}"


def export_results(
    results_root: Path,
    out: Path | None = None,
    steps: str | None = None,
    tag: str | None = None,
    training_run: str | None = None,
) -> Path:
    """`fab export`: every selected run's per-set metrics, one row per run × prompt set ×
    metric (with its comparability key), as CSV or JSON."""
    comparison = results.compare(
        results.load_runs(results_root), parse_steps(steps), tag, training_run
    )
    path = out or results_root / EXPORT_NAME
    rows = export(comparison, path)
    console.print(f"{rows} rows ({len(comparison.rows)} runs) → {shown(path)}")
    return path


def write_report(
    results_root: Path,
    steps: str | None = None,
    tag: str | None = None,
    out: Path | None = None,
    training_run: str | None = None,
    train_metric: str | None = None,
) -> Path:
    """`fab report`: the HTML report of the pulled runs (incomparable ones flagged);
    `train_metric`: the training metric drawn beside τ."""
    pulled = results.load_runs(results_root)
    comparison = results.compare(pulled, parse_steps(steps), tag, training_run)
    served_runs = served_records.load_served(results_root)
    path = _written_report(
        comparison,
        out or results_root / report.REPORT_NAME,
        results_root,
        train_metric,
        served_records.side_by_side(pulled, served_runs),
        served_records.served_groups(served_runs),
    )
    console.print(f"report: {shown(path)}")
    return path


def _written_report(
    comparison: results.Comparison,
    path: Path,
    results_root: Path,
    train_metric: str | None,
    served: list[dict[str, Any]],
    served_groups: list[RunGroup[ServedRun]],
) -> Path:
    """The HTML report of `comparison` at `path`, with the diagnoses pulled beside the runs
    and the served runs beside theirs."""
    return report.write(
        comparison,
        path,
        results.mixed_note(comparison),
        train_metric,
        report_diagnosis.pulled(results_root),
        served,
        served_groups,
    )
