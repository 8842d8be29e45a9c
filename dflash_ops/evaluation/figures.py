"""Figures of a comparison (matplotlib, headless): τ vs step with its confidence intervals,
τ per prompt set vs step, per-position acceptance and DDTree τ vs budget (with intervals
where the results carry them), and the acceptance-length histogram.

Only comparable runs are drawn (the flagged ones are left out). Each training run has its
own lines (named after it); where several evaluations of one run share a step, the line goes
through their mean and each keeps its own interval bar. `plot` saves them as PNG files; the
HTML report (dflash_ops.ui.report) inlines them as SVG.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflash_eval.contract import reading
from dflash_eval.contract.schema_metrics import Group, Interval

from dflash_ops.core.errors import ResultsError
from dflash_ops.core.files import make_dirs, write_atomic
from dflash_ops.core.text import inert
from dflash_ops.evaluation.results import Comparison, RunResult
from dflash_ops.evaluation.training_metrics import fields_of

Read = Callable[[RunResult], Interval | float | None]  # an interval, or a bare value


def build(comparison: Comparison, training_metric: str | None = None) -> dict[str, Any]:
    """Name → matplotlib figure; the per-set figure only when some run has named sets, the
    τ-and-training figure only when some run has training metrics (`training_metric`, else
    the first field logged)."""
    import matplotlib

    matplotlib.use("Agg")
    rows = [row for row in comparison.rows if row.run_id not in comparison.differences]
    figures = {
        "tau_vs_step": _tau_vs_step(rows, comparison.budgets),
        "acceptance_per_position": _acceptance(rows),
        "acceptance_lengths": _lengths(rows),
    }
    names = sorted({name for row in rows for name in _sets(row)})
    if names:
        figures["tau_by_dataset"] = _by_dataset(rows, names)
    if comparison.budgets:
        figures["ddtree_budgets"] = _ddtree(rows, comparison.budgets)
    logged = fields_of(row.training for row in rows)
    if training_metric is not None and training_metric not in logged:
        raise ResultsError(
            f"--train-metric {training_metric}: no compared run has it logged; they have: "
            f"{', '.join(logged) or 'no training metrics (inventory runs.NAME.metrics)'}"
        )
    if logged:
        figures["tau_and_training"] = _tau_and_training(rows, training_metric or logged[0])
    return figures


def plot(comparison: Comparison, out_dir: Path, training_metric: str | None = None) -> list[Path]:
    """The comparison's figures as PNG files in `out_dir` (`fab compare`)."""
    make_dirs(out_dir)
    built = build(comparison, training_metric)
    return [save_png(figure, out_dir / f"{name}.png") for name, figure in built.items()]


def save_png(figure: Any, path: Path) -> Path:
    _finish(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    _close(figure)
    return write_atomic(path, buffer.getvalue())


def svg_text(figure: Any) -> str:
    """The figure as an inline `<svg>` element (text kept as text, no external references)."""
    import matplotlib

    _finish(figure)
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure.savefig(buffer, format="svg")
    _close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _tau_vs_step(rows: list[RunResult], budgets: list[str]) -> Any:
    series: dict[str, Read] = {
        "τ vanilla (macro)": lambda r: _interval_or(r, "tau_macro"),
        "τ vanilla (pooled)": lambda r: _interval_or(r, "tau_pooled"),
    }
    for budget in budgets:
        series[f"τ DDTree-{budget}"] = lambda r, b=budget: _ddtree_interval_or(r, b)
    figure, axes = _axes("τ vs step (bars: 95 % confidence intervals over prompts)")
    for run, run_rows in _by_run(rows).items():
        for label, read in series.items():
            _line_with_intervals(axes, run_rows, read, _run_label(run, label))
    references = [
        reference["metrics"]["tau_macro"] for row in rows if (reference := row.done["reference"])
    ]
    if references:
        axes.axhline(
            _mean(references), linestyle="--", color="gray", label="reference drafter (macro)"
        )
    axes.set(xlabel="training step", ylabel="acceptance length τ")
    return figure


def _tau_and_training(rows: list[RunResult], field: str) -> Any:
    """τ macro (left axis) and a training metric at the same steps (right axis)."""
    figure, axes = _axes(f"τ and the training metric {field} vs step")
    other = axes.twinx()
    for run, run_rows in _by_run(rows).items():
        _line_with_intervals(
            axes, run_rows, lambda r: _interval_or(r, "tau_macro"), _run_label(run, "τ macro")
        )
        logged = [(r.step or 0, r.training.get(field)) for r in run_rows]
        points = sorted((step, v) for step, v in logged if isinstance(v, float))
        (line,) = other.plot(
            [step for step, _ in points],
            [v for _, v in points],
            marker="s",
            linestyle="--",
            color="black" if run is None else None,
        )
        # its legend entry on τ's axes: one legend for both
        axes.plot(
            [],
            [],
            marker="s",
            linestyle="--",
            color=line.get_color(),
            label=_run_label(run, f"{field} (training, right axis)"),
        )
    axes.set(xlabel="training step", ylabel="acceptance length τ macro")
    other.set_ylabel(field)
    axes.set_zorder(other.get_zorder() + 1)  # τ's axes, with the legend, in front
    axes.patch.set_visible(False)
    return figure


def _by_dataset(rows: list[RunResult], names: list[str]) -> Any:
    figure, axes = _axes("τ macro per prompt set vs step (95 % confidence intervals)")
    for run, run_rows in _by_run(rows).items():
        for name in names:
            _line_with_intervals(
                axes,
                [row for row in run_rows if name in _sets(row)],
                lambda r, n=name: _sets(r)[n]["tau_macro"],
                _run_label(run, name),
            )
    axes.set(xlabel="training step", ylabel="τ macro")
    return figure


def _acceptance(rows: list[RunResult]) -> Any:
    figure, axes = _axes("per-position acceptance (latest run of each step; bars: 95 % CI)")
    for label, row in _latest_of_each_step(rows):
        latest = reading.conditional_by_position(row.metrics)
        (line,) = axes.plot(list(latest), list(latest.values()), marker=".", label=label)
        overall = _overall(row)
        if overall:
            bars = [(p["position"], p["conditional"]) for p in overall["per_position"]]
            _error_bars(axes, bars, line.get_color())
    axes.set(xlabel="block position k", ylabel="P(slot k correct | slots < k correct)")
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.set_ylim(0, 1.02)
    return figure


def _ddtree(rows: list[RunResult], budgets: list[str]) -> Any:
    figure, axes = _axes("DDTree τ vs tree budget (latest run of each step; bars: 95 % CI)")
    for label, latest in _latest_of_each_step(rows):
        points = [(int(b), reading.ddtree_tau(latest.metrics, b)) for b in budgets]
        present = [(b, tau) for b, tau in points if tau is not None]
        (line,) = axes.plot(
            [b for b, _ in present], [tau for _, tau in present], marker="o", label=label
        )
        overall = _overall(latest)
        bars = [(int(b), reading.ddtree_interval(overall, b)) for b in budgets]
        _error_bars(axes, bars, line.get_color())
        vanilla = latest.metrics["tau_macro"]
        if vanilla is not None:
            axes.axhline(vanilla, linestyle=":", linewidth=0.8, color=axes.lines[-1].get_color())
    axes.set_xscale("log", base=2)
    axes.set_xticks([int(b) for b in budgets], labels=budgets)
    axes.minorticks_off()
    axes.set(xlabel="budget b (draft tree nodes; dotted: vanilla τ)", ylabel="DDTree τ macro")
    return figure


def _lengths(rows: list[RunResult]) -> Any:
    """The share of rounds that committed 1, 2, …, B tokens: bars side by side per step."""
    figure, axes = _axes("acceptance length per round (latest run of each step)")
    shown = _latest_of_each_step(rows)
    width = 0.8 / max(len(shown), 1)
    for index, (label, row) in enumerate(shown):
        counts = {int(length): count for length, count in row.metrics["histogram"].items()}
        total = sum(counts.values()) or 1
        lengths = sorted(counts)
        offset = (index - (len(shown) - 1) / 2) * width
        axes.bar(
            [length + offset for length in lengths],
            [counts[length] / total for length in lengths],
            width=width,
            label=label,
        )
    axes.set(xlabel="tokens committed in the round (τ is their mean)", ylabel="share of rounds")
    axes.xaxis.get_major_locator().set_params(integer=True)
    return figure


def _line_with_intervals(axes: Any, rows: list[RunResult], read: Read, label: str) -> None:
    """A line through the per-step means, and each run's interval as an error bar."""
    by_step = _by_step(rows)
    steps = list(by_step)
    means = [_mean([_value(read(r)) for r in by_step[s]]) for s in steps]
    (line,) = axes.plot(steps, means, marker="o", label=label)
    bars = [(r.step or 0, read(r)) for r in rows]
    _error_bars(axes, [(x, i) for x, i in bars if isinstance(i, dict)], line.get_color())


def _error_bars(axes: Any, bars: list[tuple[float, Interval | None]], color: str) -> None:
    """Each bounded interval as an error bar at its x (the unbounded and missing skipped)."""
    bounded = [(x, i) for x, i in bars if i and i["low"] is not None and i["high"] is not None]
    if bounded:
        axes.errorbar(
            [x for x, _ in bounded],
            [i["value"] for _, i in bounded],
            yerr=[
                [i["value"] - i["low"] for _, i in bounded],
                [i["high"] - i["value"] for _, i in bounded],
            ],
            fmt="none",
            ecolor=color,
            capsize=3,
            alpha=0.8,
        )


def _overall(row: RunResult) -> Group | None:
    """The run's every-prompt group with its intervals (None: results without them)."""
    block = row.done.get("by_dataset")
    return block["overall"] if block else None


def _interval_or(row: RunResult, metric: str) -> Interval | float | None:
    """The run's overall interval for `metric`, else (older results) its bare value."""
    return reading.overall_interval(row.done, metric) or row.metrics[metric]


def _ddtree_interval_or(row: RunResult, budget: str) -> Interval | float | None:
    """The run's overall DDTree τ interval at `budget`, else (older results) its value."""
    return reading.ddtree_interval(_overall(row), budget) or reading.ddtree_tau(row.metrics, budget)


def _sets(row: RunResult) -> dict[str, Group]:
    """The run's named prompt sets with their intervals ({} without)."""
    block = row.done.get("by_dataset")
    return block["datasets"] if block else {}


def _value(read: Interval | float | None) -> float | None:
    return read["value"] if isinstance(read, dict) else read


def _by_step(rows: list[RunResult]) -> dict[int, list[RunResult]]:
    grouped: dict[int, list[RunResult]] = {}
    for row in rows:
        grouped.setdefault(row.step or 0, []).append(row)
    return dict(sorted(grouped.items()))


def _by_run(rows: list[RunResult]) -> dict[str | None, list[RunResult]]:
    """The rows of each training run (None: the trainer's own checkpoints)."""
    grouped: dict[str | None, list[RunResult]] = {}
    for row in rows:
        grouped.setdefault(row.training_run, []).append(row)
    return grouped


def _run_label(run: str | None, label: str) -> str:
    """A line's legend entry (training run and prompt set names come from results files):
    control characters escaped, and `$` literal (matplotlib would read `$…$` as maths, and
    fail the drawing on a malformed formula)."""
    text = f"{run}: {label}" if run else label
    return inert(text).replace("$", r"\$")


def _latest_of_each_step(rows: list[RunResult]) -> list[tuple[str, RunResult]]:
    """Per training run and step: its label and its latest row."""
    return [
        (_run_label(run, f"step {step}"), runs[-1])
        for run, run_rows in _by_run(rows).items()
        for step, runs in _by_step(run_rows).items()
    ]


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _axes(title: str) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5))
    axes = figure.subplots()
    axes.set_title(title, fontsize=10)
    return figure, axes


def _finish(figure: Any) -> None:
    for axes in figure.axes:
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=8)
    figure.tight_layout()


def _close(figure: Any) -> None:
    figure.clear()
