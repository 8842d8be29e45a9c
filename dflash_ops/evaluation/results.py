"""Pulled results on the workstation: load, compare across steps and runs, plot.

Each run lives in `<results>/<run-id>/` (see dflash_ops.evaluation.jobs.fetch): `run.json`
(where and how it ran, its final state) and, for a successful run, the harness's `results.json`.
Runs are comparable only when everything that shapes the numbers matches: prompts, target,
block size, completion length, completion source and harness version
(`schema.COMPARABILITY`). Comparing across that line is refused unless asked for, and then
every differing row is flagged. Every results key is read through dflash_eval.schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval import schema

from dflash_ops.core.errors import OpsError

POSITIONS_SHOWN = (1, 2, 4, 8, 15)  # those inside the block are shown


class ResultsError(OpsError):
    """Results are missing, unreadable or not comparable."""


@dataclass
class RunResult:
    run_id: str
    directory: Path
    run: dict
    results: dict | None  # None for a failed, cancelled or unreadable run
    problem: str | None = None  # why the run's files cannot be used (then results is None)

    @property
    def step(self) -> int | None:
        if self.results:
            return schema.step(self.results)
        return self.run.get("step")

    @property
    def tag(self) -> str | None:
        return self.run.get("tag")

    @property
    def metrics(self) -> dict:
        assert self.results is not None
        return schema.metrics(self.results)

    def key(self) -> dict[str, Any]:
        assert self.results is not None
        return schema.comparability_key(self.results)


def load_runs(results_root: Path) -> list[RunResult]:
    """Every fetched run under `results_root`, successful ones with their results. A run
    whose files cannot be used is kept with its `problem`: one bad directory never hides the
    others."""
    runs = [_load_run(run_file.parent) for run_file in sorted(results_root.glob("*/run.json"))]
    return sorted(runs, key=lambda r: (r.step or 0, r.run.get("started") or 0))


def _load_run(directory: Path) -> RunResult:
    try:
        run = json.loads((directory / "run.json").read_text())
    except (OSError, ValueError) as exc:
        return RunResult(directory.name, directory, {}, None, f"run.json unreadable ({exc})")
    if not isinstance(run, dict):
        return RunResult(directory.name, directory, {}, None, "run.json is not a JSON object")
    results_file = directory / "results.json"
    if not results_file.exists() or run.get("problem"):
        return RunResult(directory.name, directory, run, None, run.get("problem"))
    try:
        results = json.loads(results_file.read_text())
    except (OSError, ValueError) as exc:
        return RunResult(directory.name, directory, run, None, f"results.json unreadable ({exc})")
    problem = schema.shape_problem(results)
    if problem:
        return RunResult(directory.name, directory, run, None, f"results.json: {problem}")
    return RunResult(directory.name, directory, run, results)


@dataclass
class Comparison:
    rows: list[RunResult]
    budgets: list[str]
    differences: dict[str, list[str]] = field(default_factory=dict)  # run_id -> what differs
    skipped: list[RunResult] = field(default_factory=list)  # selected, but no usable results

    @property
    def mixed(self) -> bool:
        return bool(self.differences)


def compare(
    runs: list[RunResult], steps: list[int] | None = None, tag: str | None = None
) -> Comparison:
    """The successful runs (optionally of some steps / one tag) against the latest run's
    comparability key; runs that differ are listed with what differs."""
    selected = [r for r in runs if (not steps or r.step in steps) and (tag is None or r.tag == tag)]
    rows = [r for r in selected if r.results is not None]
    skipped = [r for r in selected if r.results is None]
    if not rows:
        raise ResultsError(
            f"no successful runs to compare ({len(skipped)} failed or unreadable); fetch "
            "finished runs with `fab fetch-results`, or check the --steps/--tag filters"
        )
    baseline = rows[-1].key()
    differences = {}
    for row in rows:
        differing = [name for name, value in row.key().items() if value != baseline[name]]
        if differing:
            differences[row.run_id] = differing
    budgets = sorted({b for r in rows for b in schema.budgets(r.metrics)}, key=int)
    return Comparison(rows, budgets, differences, skipped)


def check_mixed(comparison: Comparison, allow_mixed: bool) -> str | None:
    """What sets the incomparable runs apart from the latest one (None when nothing does).
    Mixing them is refused unless `allow_mixed`."""
    if not comparison.mixed:
        return None
    what = sorted({name for names in comparison.differences.values() for name in names})
    message = (
        f"{len(comparison.differences)} run(s) differ from the latest run in "
        f"{', '.join(what)}: their numbers are not comparable"
    )
    if not allow_mixed:
        raise ResultsError(
            f"{message}. Narrow the selection (--steps/--tag) or pass "
            "--allow-mixed to show them flagged."
        )
    return message


def table_rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the comparison table."""
    block = max(row.metrics[schema.BLOCK_SIZE] for row in comparison.rows)
    positions = [k for k in POSITIONS_SHOWN if k < block]
    with_reference = any(schema.reference_metrics(row.results) for row in comparison.rows)
    header = ["run", "step", "host", "τ macro", "τ pooled"]
    header += [f"tree-{b}" for b in comparison.budgets]  # DDTree τ at budget b
    header += [f"acc@{k}" for k in positions]
    header += ["ref τ", "vs ref"] if with_reference else []
    header += ["comparable"]
    cells = []
    for row in comparison.rows:
        metrics = row.metrics
        per_position = schema.conditional_by_position(metrics)
        reference = schema.reference_metrics(row.results)
        ratio = schema.ratio_to_reference(row.results)
        differing = comparison.differences.get(row.run_id)
        cells.append(
            [
                row.run_id,
                str(row.step),
                row.run.get("host", "?"),
                _number(metrics[schema.TAU_MACRO]),
                _number(metrics[schema.TAU_POOLED]),
                *(_number(schema.ddtree_tau(metrics, b)) for b in comparison.budgets),
                *(_number(per_position.get(k)) for k in positions),
                *(
                    [
                        _number(reference[schema.TAU_MACRO]) if reference else "-",
                        f"{ratio:.2f}×" if ratio else "-",
                    ]
                    if with_reference
                    else []
                ),
                "≠ " + ", ".join(differing) if differing else "yes",
            ]
        )
    return header, cells


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def plot(comparison: Comparison, out_dir: Path) -> list[Path]:
    """τ vs step (a line per metric) and per-position acceptance per step, as PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    by_step: dict[int, list[RunResult]] = {}
    for row in comparison.rows:
        if row.run_id not in comparison.differences:
            by_step.setdefault(row.step or 0, []).append(row)
    steps = sorted(by_step)

    def mean(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return sum(present) / len(present) if present else None

    figure, axes = plt.subplots(figsize=(7, 4.5))
    series = {
        "τ vanilla (macro)": lambda m: m[schema.TAU_MACRO],
        "τ vanilla (pooled)": lambda m: m[schema.TAU_POOLED],
    }
    for budget in comparison.budgets:
        series[f"τ DDTree-{budget}"] = lambda m, b=budget: schema.ddtree_tau(m, b)
    for label, read in series.items():
        axes.plot(
            steps,
            [mean([read(r.metrics) for r in by_step[s]]) for s in steps],
            marker="o",
            label=label,
        )
    references = [
        reference[schema.TAU_MACRO]
        for r in comparison.rows
        if (reference := schema.reference_metrics(r.results))
    ]
    if references:
        axes.axhline(mean(references), linestyle="--", color="gray", label="reference drafter")
    axes.set(xlabel="training step", ylabel="acceptance length τ", title="τ vs step")
    tau_path = _save(figure, axes, out_dir / "tau_vs_step.png")

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for step in steps:
        latest = schema.conditional_by_position(by_step[step][-1].metrics)
        axes.plot(
            list(latest),
            list(latest.values()),
            marker=".",
            label=f"step {step}",
        )
    axes.set(
        xlabel="block position k",
        ylabel="P(slot k correct | slots < k correct)",
        title="per-position acceptance",
        ylim=(0, 1.02),
    )
    return [tau_path, _save(figure, axes, out_dir / "acceptance_per_position.png")]


def _save(figure: Any, axes: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
