"""A metrics log's bytes → the wanted fields' values at the wanted steps.

The trainer logs while this reads: a last line (or event record) cut short is one being
written and is left out. A step logged more than once (a resumed training) keeps its last
value. Values are floats; a non-finite one (a diverged loss) is kept as "nan", "inf" or
"-inf", since JSON numbers cannot hold it. Anything else that does not fit raises
MetricsLogError naming the file, the line (or byte) and what was expected.
"""

from __future__ import annotations

import csv
import io
import json
import math

from dflash_ops.core.errors import MetricsLogError
from dflash_ops.core.metrics_log import MetricsLog
from dflash_ops.evaluation import tfevents

Value = float | str  # a finite float, or "nan" / "inf" / "-inf"
Logged = dict[int, dict[str, Value]]  # step → field → value


def stored(value: float) -> Value:
    """A logged number as it is stored: finite as itself, else its name."""
    return value if math.isfinite(value) else str(value)


def values_at(log: MetricsLog, files: list[tuple[str, bytes]], steps: set[int]) -> Logged:
    """What the log's `files` (name, bytes; a TensorBoard directory has several) hold of
    `log.fields` at `steps`."""
    found: Logged = {}
    wanted = set(log.fields)
    for name, data in files:
        if log.format == "tensorboard":
            for step, tag, value in tfevents.scalars(data, name, wanted, steps):
                found.setdefault(step, {})[tag] = stored(value)
            continue
        text = _text(data, name)
        rows = _jsonl_rows(text, name, log) if log.format == "jsonl" else _csv_rows(text, name, log)
        for where, step, row in rows:
            if step not in steps:
                continue
            for field in wanted & row.keys():
                value = _number(row[field], f"{where}: {field}")
                if value is not None:
                    found.setdefault(step, {})[field] = value
    return found


def _text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MetricsLogError(
            f"{name}: byte {exc.start}: not UTF-8 text; is `format` right for this file?"
        ) from None


def _complete_lines(text: str) -> list[str]:
    """The lines of `text` without a last one cut short (no newline yet: being written)."""
    lines = text.split("\n")
    return lines[:-1]


def _jsonl_rows(text: str, name: str, log: MetricsLog):
    for number, line in enumerate(_complete_lines(text), 1):
        if not line.strip():
            continue
        where = f"{name}: line {number}"
        try:
            row = json.loads(line)
        except ValueError:
            raise MetricsLogError(
                f"{where}: not JSON; expected one JSON object a line (format: jsonl)"
            ) from None
        if not isinstance(row, dict):
            raise MetricsLogError(f"{where}: expected a JSON object, found {type(row).__name__}")
        if log.step_name in row:  # other records (a config, an eval summary) carry no step
            yield where, _step(row[log.step_name], f"{where}: {log.step_name}"), row


def _csv_rows(text: str, name: str, log: MetricsLog):
    reader = csv.reader(io.StringIO("\n".join(_complete_lines(text))))
    header = next(reader, None)
    if header is None:
        return
    missing = [column for column in [log.step_name, *log.fields] if column not in header]
    if missing:
        raise MetricsLogError(
            f"{name}: line 1: no column {', '.join(missing)}; its columns: {', '.join(header)}"
            " (the inventory's metrics.step_key / fields name them)"
        )
    for number, cells in enumerate(reader, 2):
        if not cells:
            continue
        where = f"{name}: line {number}"
        if len(cells) != len(header):
            raise MetricsLogError(
                f"{where}: {len(cells)} cells where the header has {len(header)} columns"
            )
        row = {column: cell for column, cell in zip(header, cells, strict=True) if cell != ""}
        if log.step_name in row:
            yield where, _step(row[log.step_name], f"{where}: {log.step_name}"), row


def _step(value: object, where: str) -> int:
    try:
        number = _number(value, where)
    except MetricsLogError:
        number = None
    if isinstance(number, float) and number.is_integer() and number >= 0:
        return int(number)
    raise MetricsLogError(f"{where}: expected a training step (a whole number), found {value!r}")


def _number(value: object, where: str) -> Value | None:
    """A logged value as a float (None: none logged here)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return stored(float(value))
        except ValueError:
            pass
    elif isinstance(value, int | float) and not isinstance(value, bool):
        return stored(float(value))
    raise MetricsLogError(f"{where}: expected a number, found {str(value)[:40]!r}")
