"""What happens to a run once it is pulled: its training metrics are read (training_fetch),
and, with `--wandb PROJECT` (run-eval, watch) or `fab wandb-sync --project PROJECT` (runs
already pulled), its numbers go to Weights & Biases.

W&B is an optional dependency (`pip install 'dflash-ops[wandb]'`), off by default. Each
training run and comparability key (reading.key_id; and tag) is one W&B run in PROJECT,
resumed by a stable id, so runs that may not be compared never share a curve; the training
step is its x axis (`training_step`, so steps logged out of order — a sweep, a re-run —
still land where they belong): `eval/*` holds τ with its interval and the headline metrics
of compare's records (compare_rows.run_records), `sets/<prompt set>/*` τ of each prompt set with
its interval, `train/*` the training run's own metrics at that step. A run sent is recorded
in its directory (SENT_FILE), so a sync sends only what was not sent yet. W&B reads its own
settings from the environment (WANDB_MODE=offline, WANDB_DIR, …); its files go under
`<results>/wandb` unless WANDB_DIR says otherwise. A W&B failure is one line: the evaluation
and its results never depend on it.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from dflash_eval.contract.reading import groups
from rich.markup import escape

from dflash_ops.core.errors import TrackerError
from dflash_ops.core.files import write_atomic
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.records import Record, RecordError, read_json_file, validate
from dflash_ops.evaluation import compare_rows, results, training_fetch, training_metrics
from dflash_ops.evaluation.groups import key_fields

WANDB_DIR = "wandb"  # under the results directory
SENT_FILE = "wandb.json"  # in a run's directory: where it was sent
STEP_METRIC = "training_step"
SET_METRICS = ("tau_macro", "tau_pooled")  # logged per prompt set, with their intervals
# compare's record keys that name a run rather than measure it
_IDENTITY = {"step", "group", "best_tree_budget"}
_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# wandb keeps one active run per process: runs of a sweep's hosts are logged one at a time.
_ONE_AT_A_TIME = threading.Lock()


def require_wandb(project: str) -> None:
    """Refuse, before anything runs, a project name W&B would refuse or a missing wandb."""
    if not _PROJECT.fullmatch(project):
        raise TrackerError(
            f"--wandb: expected a W&B project name (letters, digits and . - _, at most 128), "
            f"found {project!r}"
        )
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise TrackerError(
            "--wandb: the wandb package is not installed here; pip install 'dflash-ops[wandb]' "
            "(or run without --wandb)"
        ) from None


def after_pull(
    inventory: Inventory,
    run_ids: Collection[str],
    say: Callable[[str], None],
    wandb_project: str | None = None,
) -> None:
    """For freshly pulled successful runs: store their training metrics, then log them to
    W&B when a project is given. A run flagged not comparable (set_anchors) gets neither,
    and its flag is said."""
    rows = [results.load_run(inventory.local.results / run_id) for run_id in run_ids]
    run_ids = [row.directory.name for row in rows if not said_if_flagged(row, say)]
    if not run_ids:
        return
    training_fetch.attach(inventory, inventory.local.results, say, only=run_ids)
    if wandb_project:
        for run_id in run_ids:
            log_run(wandb_project, inventory.local.results, run_id, say)


def said_if_flagged(row: results.RunResult, say: Callable[[str], None]) -> bool:
    """Whether a pulled run is flagged not comparable whatever its key; the flag is said."""
    if row.flag is not None:
        say(
            f"[yellow]not comparable[/]: run {escape(row.run_id)}: {escape(row.flag)} (kept; "
            "left out of comparisons, training metrics and W&B)"
        )
    return row.flag is not None


def wandb_values(row: results.RunResult) -> dict[str, float]:
    """The numbers a pulled run sends to W&B: `eval/<key>` for τ, its interval and the
    headline metrics, `sets/<prompt set>/<metric>[_low|_high]` for τ of each prompt set,
    `train/<field>` for its training metrics; the step as STEP_METRIC."""
    record = compare_rows.run_records(results.compare([row]))[0]
    values: dict[str, float] = {STEP_METRIC: float(row.step or 0)}
    for key, value in record.items():
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if key.startswith(training_metrics.KEY_PREFIX) and value is not None:
            # "nan", "inf" as float: W&B takes non-finite values
            values["train/" + key.removeprefix(training_metrics.KEY_PREFIX)] = float(value)
        elif numeric and key not in _IDENTITY and math.isfinite(value):
            values[f"eval/{key}"] = float(value)
    for name, group in groups(row.done).items():
        prefix = "sets/" + name.replace("/", "_")
        for metric in SET_METRICS:
            interval = group[metric]
            if interval is None:  # a set without rounds: no τ to log
                continue
            bounds = {"": interval["value"], "_low": interval["low"], "_high": interval["high"]}
            for suffix, value in bounds.items():
                if value is not None:
                    values[f"{prefix}/{metric}{suffix}"] = float(value)
    return values


def wandb_run_id(row: results.RunResult) -> str:
    """One W&B run per training run, tag and comparability key: evaluations of its steps
    that may be compared resume it; the key is kept whole however long the names are."""
    parts = ["dflash-eval", row.training_run or "default", *([row.tag] if row.tag else [])]
    named = re.sub(r"[^A-Za-z0-9_-]", "_", "-".join(parts))
    return f"{named[: 63 - len(row.key_id)]}-{row.key_id}"


class SentRecord(Record):
    """A run's SENT_FILE: the W&B runs it was logged to, each as 'PROJECT/RUN-ID'."""

    sent: list[str]


def _sent_to(directory: Path) -> list[str]:
    try:
        return list(validate(read_json_file(directory / SENT_FILE), SENT_FILE, SentRecord).sent)
    except RecordError:
        return []  # none, or unreadable: sent again (W&B keeps one value per step and key)


def was_sent(project: str, row: results.RunResult) -> bool:
    """Whether this run was logged to its W&B run in `project` already."""
    return f"{project}/{wandb_run_id(row)}" in _sent_to(row.directory)


def _mark_sent(project: str, row: results.RunResult) -> None:
    sent = [*_sent_to(row.directory), f"{project}/{wandb_run_id(row)}"]
    record = {"sent": sent, "at": time.time()}
    write_atomic(row.directory / SENT_FILE, json.dumps(record, indent=2) + "\n")


def log_run(project: str, results_root: Path, run_id: str, say: Callable[[str], None]) -> bool:
    """Log one pulled run to W&B; False (and one line said) when it could not be."""
    row = results.load_run(results_root / run_id)
    if row.results is None or row.flag is not None:  # flagged: said by the callers
        return False
    try:
        with _ONE_AT_A_TIME:
            _log(project, results_root, row)
        _mark_sent(project, row)
    # wandb raises many kinds of errors (network, auth, its service process): whichever it
    # is, the evaluation is done and its results are safe, so it is said, never raised.
    except Exception as exc:
        reason = escape(str(exc))
        say(f"W&B: run {run_id} not logged to {project}: {reason} (the results are unaffected)")
        return False
    say(f"W&B: step {row.step} logged to {project} (run {wandb_run_id(row)})")
    return True


def sync(project: str, results_root: Path, say: Callable[[str], None]) -> tuple[int, int]:
    """Send every pulled successful run not yet sent to `project`; (sent, not sent because
    W&B failed). Runs sent before are passed over, so a second sync sends nothing."""
    require_wandb(project)
    sent = failed = 0
    for row in results.load_runs(results_root):
        if row.results is None or said_if_flagged(row, say) or was_sent(project, row):
            continue
        if log_run(project, results_root, row.run_id, say):
            sent += 1
        else:
            failed += 1
    return sent, failed


def _log(project: str, results_root: Path, row: results.RunResult) -> None:
    import wandb

    directory = Path(os.environ.get("WANDB_DIR") or results_root / WANDB_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "training_run": row.training_run,
        "tag": row.tag,
        **key_fields(row.done),
    }
    name = row.training_run or "default"
    run = wandb.init(
        project=project,
        id=wandb_run_id(row),
        name=f"{name} eval" + (f" ({row.tag})" if row.tag else "") + f" {row.key_id}",
        job_type="eval",
        resume="allow",
        dir=str(directory),
        config=config,
        settings=wandb.Settings(silent=True, console="off"),
    )
    try:
        run.define_metric(STEP_METRIC)
        run.define_metric("eval/*", step_metric=STEP_METRIC)
        run.define_metric("sets/*", step_metric=STEP_METRIC)
        run.define_metric("train/*", step_metric=STEP_METRIC)
        run.log({**wandb_values(row), "eval/run_id": row.run_id})
    finally:
        run.finish()
