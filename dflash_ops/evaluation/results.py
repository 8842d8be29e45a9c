"""Pulled results on the workstation: load, compare across steps and runs (with the 95 %
confidence intervals the harness computed per prompt set, and whether consecutive steps'
intervals overlap). Figures are in dflash_ops.evaluation.figures.

Each run lives in `<results>/<run-id>/` (see dflash_ops.evaluation.jobs.fetch): `run.json`
(where and how it ran, its final state) and, for a successful run, the harness's `results.json`.
Runs are comparable only when everything that shapes the numbers matches: prompts, target,
block size, completion length, completion source and harness version
(`schema.COMPARABILITY`). Comparing across that line is refused unless asked for, and then
every differing row is flagged. Every results key is read through dflash_eval.schema.

Several training runs (`--run NAME`: v4, v5, …) can have the same step: their results are
kept apart, grouped by run, each row labelled with its run (none for the trainer's own).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval import schema

from dflash_ops.core.errors import OpsError
from dflash_ops.core.records import RecordError, read_json_file, validate
from dflash_ops.evaluation.records import Results, RunSummary

POSITIONS_SHOWN = (1, 2, 4, 8, 15)  # those inside the block are shown
TRAINING_RUN = "training run"  # the column shown when some row belongs to a named run
DEFAULT_RUN = "-"  # how that column shows the trainer's own checkpoints


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
    def training_run(self) -> str | None:
        """The training run its checkpoint came from (None: the trainer's own)."""
        if self.results:
            return schema.training_run(self.results)
        return self.run.get("training_run")

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
    name = _printable(directory.name)
    try:
        run = validate(read_json_file(directory / "run.json", "run.json"), "run.json", RunSummary)
    except RecordError as exc:
        return RunResult(name, directory, {}, None, str(exc))
    summary = run.model_dump(exclude_unset=True)
    if name != directory.name:
        return RunResult(
            name,
            directory,
            summary,
            None,
            "its directory name holds control "
            "characters: not a run this tool fetched; move it aside",
        )
    if not (directory / "results.json").exists() or run.problem:
        return RunResult(name, directory, summary, None, run.problem)
    try:
        results = read_results(directory)
    except RecordError as exc:
        return RunResult(name, directory, summary, None, str(exc))
    return RunResult(name, directory, summary, results)


def read_results(directory: Path) -> dict:
    """A fetched run's results.json, bounded and typed where it is read (RecordError
    names the first thing wrong)."""
    results = read_json_file(directory / "results.json", "results.json")
    if _ours(results):  # typed first: the first wrong field named, not a reader's crash
        validate(results, "results.json", Results)
    problem = schema.shape_problem(results)
    if problem:
        raise RecordError(f"results.json: {problem}")
    return results


def _ours(results: object) -> bool:
    """Whether a file claims to be results of the schema this dflash-ops reads."""
    return (
        isinstance(results, dict)
        and results.get(schema.KIND_KEY) == schema.KIND
        and results.get(schema.SCHEMA_VERSION_KEY) == schema.SCHEMA_VERSION
    )


def _printable(name: str) -> str:
    """A directory name as it can be shown on one line (control characters escaped)."""
    return name if name.isprintable() else name.encode("unicode_escape").decode("ascii")


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
    runs: list[RunResult],
    steps: list[int] | None = None,
    tag: str | None = None,
    training_run: str | None = None,
) -> Comparison:
    """The successful runs (optionally of some steps / one tag / one training run), grouped
    by training run, against the latest run's comparability key; runs that differ are listed
    with what differs."""
    selected = [
        r
        for r in runs
        if (not steps or r.step in steps)
        and (tag is None or r.tag == tag)
        and (training_run is None or r.training_run == training_run)
    ]
    # sorted() is stable: within a training run, the order load_runs gave (step, start)
    selected = sorted(selected, key=lambda r: r.training_run or "")
    rows = [r for r in selected if r.results is not None]
    skipped = [r for r in selected if r.results is None]
    if not rows:
        raise ResultsError(
            f"no successful runs to compare ({len(skipped)} failed or unreadable); fetch "
            "finished runs with `fab fetch-results`, or check the --steps/--tag/--run filters"
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
    with_intervals = any(schema.overall_group(row.results) for row in comparison.rows)
    with_runs = any(row.training_run for row in comparison.rows)
    header = ["run", *[TRAINING_RUN] * with_runs, "step", "host", "τ macro", "τ pooled"]
    header += ["τ macro 95% CI"] if with_intervals else []
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
                *[row.training_run or DEFAULT_RUN] * with_runs,
                str(row.step),
                row.run.get("host", "?"),
                _number(metrics[schema.TAU_MACRO]),
                _number(metrics[schema.TAU_POOLED]),
                *(
                    [_bounds(schema.group_interval(schema.overall_group(row.results)))]
                    * with_intervals
                ),
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


def _bounds(interval: dict | None) -> str:
    if not interval:
        return "-"
    if interval[schema.LOW] is None:
        return "[1 unit]"  # a single prompt (or conversation) gives no interval
    return f"[{interval[schema.LOW]:.3f}, {interval[schema.HIGH]:.3f}]"


def _with_interval(interval: dict | None) -> str:
    return "-" if not interval else f"{interval[schema.VALUE]:.3f} {_bounds(interval)}"


ALL_PROMPTS = "all prompts"  # the row of a run's every prompt in the per-set table
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
        for name, group in _groups(row).items():
            conditional = schema.group_conditional(group)
            cells.append(
                [
                    row.run_id,
                    *[row.training_run or DEFAULT_RUN] * with_runs,
                    str(row.step),
                    name,
                    str(group[schema.GROUP_PROMPTS]),
                    _with_interval(schema.group_interval(group, schema.TAU_MACRO)),
                    _with_interval(schema.group_interval(group, schema.TAU_POOLED)),
                    *(_with_interval(schema.group_ddtree(group, b)) for b in comparison.budgets),
                    *(_with_interval(conditional.get(k)) for k in ACCEPTANCE_IN_SETS),
                ]
            )
    return header, cells


def overlap_notes(comparison: Comparison) -> list[str]:
    """For each pair of consecutive comparable runs (by step, within one training run), and
    each prompt set they share: do their τ macro intervals overlap? Disjoint 95 % intervals
    mean a real change; overlapping ones mean these prompts cannot tell the two apart."""
    rows = [
        row
        for row in comparison.rows
        if row.run_id not in comparison.differences and schema.overall_group(row.results)
    ]
    notes = []
    for before, after in itertools.pairwise(rows):
        if before.training_run != after.training_run:
            continue  # another training run's steps: not a change of this one
        first, second = _groups(before), _groups(after)
        for name in [n for n in first if n in second]:
            a = schema.group_interval(first[name])
            b = schema.group_interval(second[name])
            verdict = schema.overlaps(a, b)
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


def _groups(row: RunResult) -> dict[str, dict]:
    overall = schema.overall_group(row.results)
    if overall is None:
        return {}
    return {ALL_PROMPTS: overall, **schema.dataset_groups(row.results)}
