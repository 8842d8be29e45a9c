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

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from dflash_eval.contract import reading
from dflash_eval.contract.reading import groups
from dflash_eval.contract.schema import Results
from dflash_eval.contract.schema_check import SchemaError, parse_results
from dflash_eval.contract.schema_metrics import Interval, Metrics

from dflash_ops.core.errors import ResultsError
from dflash_ops.core.records import RecordError, read_json_file, validate
from dflash_ops.core.text import check_tag, inert
from dflash_ops.evaluation import run_ids, set_anchors, training_metrics
from dflash_ops.evaluation.groups import RunGroup, group_runs, mark_against, pick_group
from dflash_ops.evaluation.records import RunSummary
from dflash_ops.evaluation.run_ids import short_ids

POSITIONS_SHOWN = (1, 2, 4, 8, 15)  # those inside the block are shown
TRAINING_RUN = "training run"  # the column shown when some row belongs to a named run
DEFAULT_RUN = "-"  # how that column shows the trainer's own checkpoints


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
