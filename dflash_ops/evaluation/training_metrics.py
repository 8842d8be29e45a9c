"""Training metrics beside τ: what a pulled run's `training.json` holds, and how records,
tables and figures name it.

`<results>/<run-id>/training.json` is written when the run is pulled (or by a later `fab
fetch-results`) from its training run's metrics log (dflash_ops.evaluation.training_fetch):

    {"step": 4000, "training_run": "v5",
     "log": {"path": "/workspace/v5/metrics.jsonl", "format": "jsonl"},
     "values": {"loss": 1.93, "train_acc": 0.41}}

A value is a float, or "nan" / "inf" / "-inf" for a non-finite one (training_log.stored).
Compare's records carry each field (compare_records: the key `train.<field>` in JSON and CSV).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from dflash_ops.core.records import Record, RecordError, read_json_file, validate
from dflash_ops.evaluation.training_log import Value

TRAINING_FILE = "training.json"


class LogSource(Record):
    path: str
    format: str


class TrainingRecord(Record):
    """A run's training.json."""

    step: int
    training_run: str | None = None
    log: LogSource
    values: dict[str, float | str]


def record_of(directory: Path) -> TrainingRecord | None:
    """The training.json of the run in `directory` (None: none was read, or it is damaged:
    the next fetch-results reads the log again for it, see training_fetch)."""
    path = directory / TRAINING_FILE
    if not path.exists():
        return None
    try:
        return validate(read_json_file(path), TRAINING_FILE, TrainingRecord)
    except RecordError:
        return None


def values_of(directory: Path) -> dict[str, Value]:
    """The training metrics stored with the run in `directory` ({} when none were read)."""
    record = record_of(directory)
    return dict(record.values) if record else {}


def fields_of(values: Iterable[dict[str, Value]]) -> list[str]:
    """Every field any of the runs has, in first-seen order."""
    return list(dict.fromkeys(field for run in values for field in run))


def shown(value: Value | None) -> str:
    """A training metric as the tables show it (4 significant digits: losses and rates)."""
    if value is None:
        return "-"
    return value if isinstance(value, str) else f"{value:.4g}"
