"""The records behind `fab compare` and `fab export` (compare_rows builds them from a
comparison): a RunRecord per compared run, a SetRecord per run × prompt set × metric.

Their fields are typed; the families whose members depend on the runs compared are mappings:
DDTree τ by budget, acceptance by slot, the training run's metrics by field. `flat()` is the
one place their JSON and CSV keys are written, in this order:

    run_id short_id training_run step host tag comparability_key      (every record)
    group comparable differs tau_macro has_interval tau_macro_low tau_macro_high tau_pooled
    tree_<b>… best_tree best_tree_budget acc_<k>… reference_tau vs_reference
    train.<field>…                                                    (a run record)
    prompt_set prompts metric value low high                          (a set record)

Values are plain (numbers stay numbers, None where a run has none): a program reads back
what compare computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from dflash_ops.evaluation.training_log import Value

TRAINING_PREFIX = "train."  # a training field's key in a flat run record


@dataclass(frozen=True)
class RunIdentity:
    """What names a run in a record; `comparability_key` is the short name of its key, the
    same in every export however many runs are added."""

    run_id: str
    short_id: str
    training_run: str | None  # None: the trainer's own checkpoints
    step: int | None
    host: str | None
    tag: str | None
    comparability_key: str

    def identity(self) -> dict[str, Any]:
        return {item.name: getattr(self, item.name) for item in fields(RunIdentity)}


@dataclass(frozen=True)
class RunRecord(RunIdentity):
    """One compared run, as compare's JSON, CSV, tables and the report read it."""

    group: int  # the number of its comparability group
    comparable: bool  # with the compared group
    differs: str | None  # what differs from the compared group, when not comparable
    tau_macro: float | None
    has_interval: bool  # its τ macro has a recorded interval (its bounds may still be None)
    tau_macro_low: float | None  # None with an interval: one prompt, no bounds
    tau_macro_high: float | None
    tau_pooled: float | None
    trees: Mapping[str, float | None]  # DDTree τ by budget, every budget compared
    best_tree: float | None
    best_tree_budget: int | None
    acceptance: Mapping[int, float | None]  # conditional acceptance by slot shown
    reference_tau: float | None  # the reference drafter's τ macro
    vs_reference: float | None  # its τ macro over the reference's
    training: Mapping[str, Value | None]  # every field any compared run logged

    def evaluated(self) -> dict[str, Any]:
        """What the comparison says of the run, as flat keys (W&B's `eval/*`)."""
        return {
            "group": self.group,
            "comparable": self.comparable,
            "differs": self.differs,
            "tau_macro": self.tau_macro,
            "has_interval": self.has_interval,
            "tau_macro_low": self.tau_macro_low,
            "tau_macro_high": self.tau_macro_high,
            "tau_pooled": self.tau_pooled,
            **{f"tree_{budget}": tau for budget, tau in self.trees.items()},
            "best_tree": self.best_tree,
            "best_tree_budget": self.best_tree_budget,
            **{f"acc_{slot}": rate for slot, rate in self.acceptance.items()},
            "reference_tau": self.reference_tau,
            "vs_reference": self.vs_reference,
        }

    def flat(self) -> dict[str, Any]:
        """The record as `fab compare --format json|csv` writes it."""
        trained = {TRAINING_PREFIX + name: value for name, value in self.training.items()}
        return {**self.identity(), **self.evaluated(), **trained}


@dataclass(frozen=True)
class SetRecord(RunIdentity):
    """One metric of one prompt set of a run, with its 95 % interval (`fab export`)."""

    prompt_set: str
    prompts: int
    metric: str  # a run record's flat key: tau_macro, tau_pooled, tree_<b>, acc_<k>
    value: float | None
    low: float | None  # None: no bounds (one prompt, or results from before intervals)
    high: float | None

    def flat(self) -> dict[str, Any]:
        """The record as `fab export` writes it."""
        return asdict(self)
