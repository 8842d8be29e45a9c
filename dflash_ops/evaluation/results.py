"""Pulled results on the workstation: load, compare across steps and runs (with the 95 %
confidence intervals the harness computed per prompt set, and whether consecutive steps'
intervals overlap). Figures are in dflash_ops.evaluation.figures.

Each run lives in `<results>/<run-id>/` (see dflash_ops.evaluation.jobs.fetch): `run.json`
(where and how it ran, its final state) and, for a successful run, the harness's `results.json`.
Runs are comparable only when everything that shapes the numbers matches: prompts, target,
block size, completion length, completion source and the harness's numerics version
(`reading.COMPARABILITY`; not its content hash: a harness edit that moves no number keeps
earlier results comparable). Comparing across that line is refused unless asked for, and then
every differing row is flagged. A results file is checked against the types of
dflash_eval.contract.schema once, on loading (`schema_check.parse_results`), and read through them.

Several training runs (`--run NAME`: v4, v5, …) can have the same step: their results are
kept apart, grouped by run, each row labelled with its run (none for the trainer's own).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from dflash_eval.contract import reading
from dflash_eval.contract.schema import Results
from dflash_eval.contract.schema_check import SchemaError, parse_results
from dflash_eval.contract.schema_metrics import Metrics

from dflash_ops.core.errors import ResultsError
from dflash_ops.core.records import RecordError, read_json_file, validate
from dflash_ops.core.text import check_tag, inert
from dflash_ops.evaluation import run_ids, set_anchors, training_metrics
from dflash_ops.evaluation.groups import RunGroup, group_runs, mark_against, pick_group
from dflash_ops.evaluation.records import RunSummary
from dflash_ops.evaluation.run_ids import short_ids


@dataclass
class RunResult:
    run_id: str
    directory: Path
    run: dict
    results: Results | None  # None for a failed, cancelled or unreadable run
    problem: str | None = None  # why the run's files cannot be used (then results is None)
    flag: str | None = None  # why its numbers are not comparable whatever its key (set_anchors)

    @property
    def step(self) -> int | None:
        if self.results:
            return self.results["checkpoint"]["step"]
        return self.run.get("step")

    @property
    def tag(self) -> str | None:
        return self.run.get("tag")

    @property
    def training_run(self) -> str | None:
        """The training run its checkpoint came from (None: the trainer's own)."""
        if self.results:
            return self.results["checkpoint"].get("training_run")
        return self.run.get("training_run")

    @cached_property
    def training(self) -> dict[str, training_metrics.Value]:
        """Its training run's logged metrics at its step (training_metrics; {}: none)."""
        return training_metrics.values_of(self.directory)

    @property
    def metrics(self) -> Metrics:
        assert self.results is not None
        return self.results["metrics"]

    @property
    def done(self) -> Results:
        """The results of a successful run (only those are compared)."""
        assert self.results is not None
        return self.results

    def key(self) -> dict[str, Any]:
        return reading.comparability_key(self.done)

    @property
    def key_id(self) -> str:
        """Its comparability key's short, stable name (reading.key_id)."""
        return reading.comparability_id(self.done)


def load_runs(results_root: Path) -> list[RunResult]:
    """Every fetched run under `results_root`, successful ones with their results. A run
    whose files cannot be used is kept with its `problem`: one bad directory never hides the
    others."""
    runs = [load_run(run_file.parent) for run_file in sorted(results_root.glob("*/run.json"))]
    return sorted(runs, key=lambda r: (r.step or 0, r.run.get("started") or 0))


def load_run(directory: Path) -> RunResult:
    """The fetched run in `directory` (see load_runs)."""
    name = inert(directory.name)
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
        results = read_results(directory / "results.json")
    except ResultsError as exc:
        return RunResult(name, directory, summary, None, str(exc))
    flag = set_anchors.flag_of(directory.parent, results, run.host)
    return RunResult(name, directory, summary, results, flag=flag)


def read_results(path: Path) -> Results:
    """A pulled results file, bounded in size and nesting first (core/records.py), then
    checked against the schema's types; ResultsError names the first thing wrong."""
    try:
        return parse_results(read_json_file(path))
    except RecordError as exc:
        raise ResultsError(str(exc)) from None
    except SchemaError as exc:
        raise ResultsError(f"{path}: {exc}") from None


@dataclass
class Comparison:
    rows: list[RunResult]  # every selected run with results, the compared group's and others'
    budgets: list[str]
    differences: dict[str, list[str]] = field(default_factory=dict)  # run_id -> what differs
    skipped: list[RunResult] = field(default_factory=list)  # selected, but no usable results
    groups: list[RunGroup[RunResult]] = field(default_factory=list)  # largest first
    compared: int = 1  # the number of the group the others are measured against

    @property
    def mixed(self) -> bool:
        return bool(self.differences)

    @property
    def group(self) -> RunGroup[RunResult]:
        return self.groups[self.compared - 1]

    def others(self) -> list[RunGroup[RunResult]]:
        """The groups not compared, each with what sets it apart."""
        return [group for group in self.groups if group.number != self.compared]

    def within(self) -> Comparison:
        """Only the compared group's runs (nothing flagged); the other groups stay known."""
        rows = [row for row in self.rows if row.run_id not in self.differences]
        budgets = sorted({b for r in rows for b in r.metrics["ddtree"]}, key=int)
        return replace(self, rows=rows, budgets=budgets, differences={})

    def group_of(self, run_id: str) -> int:
        return next(g.number for g in self.groups if any(r.run_id == run_id for r in g.rows))


def compare(
    runs: list[RunResult],
    steps: list[int] | None = None,
    tag: str | None = None,
    training_run: str | None = None,
    group: int | str | None = None,
    baseline: str | None = None,
) -> Comparison:
    """The successful runs (optionally of some steps / one tag / one training run), grouped
    by training run, split into comparability groups (dflash_ops.evaluation.groups); the
    runs outside the compared group (`group`: its number or key, else the one holding run
    `baseline`, else the largest) are listed with what differs."""
    check_tag(tag)
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
    found = group_runs(rows, RunResult.key, lambda r: r.run.get("started") or 0)
    chosen = _chosen_group(found, rows, group, baseline)
    mark_against(found, chosen)
    differences = {
        row.run_id: other.differs for other in found if other is not chosen for row in other.rows
    }
    for row in (row for row in rows if row.flag):  # flagged whichever group it is in
        differences[row.run_id] = [*differences.get(row.run_id, []), set_anchors.FLAG]
    budgets = sorted({b for r in rows for b in r.metrics["ddtree"]}, key=int)
    return Comparison(rows, budgets, differences, skipped, found, chosen.number)


def _chosen_group(
    found: list[RunGroup[RunResult]],
    rows: list[RunResult],
    group: int | str | None,
    baseline: str | None,
) -> RunGroup[RunResult]:
    if group is not None and baseline is not None:
        raise ResultsError("--group and --baseline both choose the group: pass one of them")
    if baseline is not None:
        run_id = run_ids.match([r.run_id for r in rows], baseline, "among the results compared")
        return next(g for g in found if any(r.run_id == run_id for r in g.rows))
    if group is None:  # the largest group with a run not flagged
        return next((g for g in found if not all(r.flag for r in g.rows)), found[0])
    return pick_group(found, group)


def mixed_note(comparison: Comparison) -> str | None:
    """What sets the runs outside the compared group apart (None when all are in it)."""
    if not comparison.mixed:
        return None
    what = sorted({name for names in comparison.differences.values() for name in names})
    size, why = len(comparison.group.rows), {**reading.COMPARABILITY_WHY, **set_anchors.WHY}
    return (
        f"{len(comparison.differences)} run(s) differ from comparability group "
        f"{comparison.compared} ({size} run(s)) in {', '.join(what)}: their numbers are not "
        "comparable with that group's"
        + "".join(f" ({name}: {why[name]})" for name in what if name in why)
        + "".join(f"; {row.run_id}: {row.flag}" for row in comparison.rows if row.flag)
    )


def group_lines(comparison: Comparison) -> list[str]:
    """One line per group not compared: its runs and what sets it apart, and how to see it."""
    lines = []
    for other in comparison.others():
        ids = short_ids(r.run_id for r in comparison.rows)
        runs = ", ".join(f"step {r.step} {ids[r.run_id]}" for r in other.rows[:4])
        more = f" and {len(other.rows) - 4} more" if len(other.rows) > 4 else ""
        lines.append(
            f"group {other.number}: {len(other.rows)} run(s) ({runs}{more}) differ in "
            f"{', '.join(other.differs)}; compare them with --group {other.number} (key "
            f"{other.id})"
        )
    return lines
