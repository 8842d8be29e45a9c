"""Typed shapes of the run files the workstation reads back (see core/records.py): a run's
params.json (on the eval host), its run.json (written by `fetch`), and the part of the
harness's results.json that compare, report and watch read (docs/results-schema.md).

Only what is read is typed; every other key passes through untouched. A file that does not
fit is a broken run, listed with the reason, never a crash of the listing around it.
"""

from __future__ import annotations

from pydantic import Field

from dflash_ops.core.records import Record

# --- params.json and run.json --------------------------------------------------------------


class RunParams(Record):
    """What was asked of a run (params.json), as far as listings read it."""

    step: int | None = None
    started: float | None = None  # epoch seconds
    tag: str | None = None
    training_run: str | None = None
    kind: str | None = None  # "features" for an extract-features run


class RunSummary(RunParams):
    """A fetched run's run.json (jobs.fetch)."""

    run_id: str | None = None
    host: str | None = None
    state: str | None = None
    exit_code: int | None = None
    finished: float | None = None
    problem: str | None = None


# --- results.json ----------------------------------------------------------------------------


class Checkpoint(Record):
    step: int | None
    training_run: str | None = None


class Position(Record):
    position: int
    conditional: float | None


class BudgetMetrics(Record):
    tau_macro: float | None = None
    tau_pooled: float | None = None


class Metrics(Record):
    block_size: int
    tau_macro: float
    tau_pooled: float
    rounds: int
    committed_tokens: int
    per_position: list[Position]
    ddtree: dict[str, BudgetMetrics]
    capped: BudgetMetrics | None = None


class Interval(Record):
    value: float
    low: float | None
    high: float | None


class GroupBudget(Record):
    tau_macro: Interval | None = None


class GroupPosition(Record):
    position: int
    conditional: Interval | None


class Group(Record):
    prompts: int
    tau_macro: Interval | None = None
    tau_pooled: Interval | None = None
    ddtree: dict[str, GroupBudget] = Field(default_factory=dict)
    per_position: list[GroupPosition] = Field(default_factory=list)


class Bootstrap(Record):
    method: str
    unit: str
    resamples: int
    seed: int


class ByDataset(Record):
    bootstrap: Bootstrap
    overall: Group
    datasets: dict[str, Group] = Field(default_factory=dict)


class Reference(Record):
    metrics: Metrics


class Ratio(Record):
    tau_macro: float | None = None


class Timings(Record):
    total: float


class Results(Record):
    """The fields of results.json that the workstation reads (the schema's names)."""

    checkpoint: Checkpoint
    metrics: Metrics
    reference: Reference | None = None
    comparison: Ratio | None = None
    by_dataset: ByDataset | None = None
    warnings: list[str] = Field(default_factory=list)
    timings_s: Timings
