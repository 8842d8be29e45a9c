"""The one reader of every JSON file the tool reads back: a run's params.json and run.json,
results.json, the watch state, staging manifests, feature-set records.

Those files come from hosts and disks that can hold anything: a truncated write, a text where
a number goes, a file nested a million levels deep. Each is read here with its size and
nesting bounded (json's own recursion would otherwise die with RecursionError), and, when a
model is given, its fields typed and checked by pydantic (strict: "3" is no number, and no
number is infinite). What fails raises RecordError naming the file and the first bad field;
callers list such a file as broken and go on with the others.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from dflash_ops.core.errors import OpsError

MAX_RECORD_BYTES = 64 << 20  # a results.json with every prompt's numbers and samples fits
MAX_LINES_BYTES = 1 << 30  # a prompts file: large, but not the disk
MAX_DEPTH = 32  # results nest about 7 levels; anything far deeper is no record of ours

Model = TypeVar("Model", bound=BaseModel)


class RecordError(OpsError):
    """A file read back is damaged, too large, too deep, or has a field of the wrong type."""


class Record(BaseModel):
    """Base of the typed records: unknown keys kept (newer writers add some), known ones
    strictly typed, numbers finite."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, frozen=True)


def parse_json(
    text: str | bytes, what: str, *, max_bytes: int = MAX_RECORD_BYTES, max_depth: int = MAX_DEPTH
) -> Any:
    """The JSON value of `text` (the content of `what`, named in errors), bounded."""
    if len(text) > max_bytes:
        raise RecordError(f"{what}: {len(text)} bytes, more than the {max_bytes} a record may hold")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(f"{what}: not UTF-8 text (byte {exc.start})") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise RecordError(f"{what}: nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise RecordError(f"{what}: not valid JSON ({exc})") from None
    if _depth(value) > max_depth:
        raise RecordError(f"{what}: nested deeper than {max_depth} levels")
    return value


def parse_record(text: str | bytes, what: str, model: type[Model]) -> Model:
    """`text` as a `model` record (a JSON object whose fields have the model's types)."""
    return validate(parse_json(text, what), what, model)


def validate(value: Any, what: str, model: type[Model]) -> Model:
    """An already parsed JSON value as a `model` record; the first bad field named."""
    if not isinstance(value, dict):
        raise RecordError(f"{what}: expected a JSON object, found {type(value).__name__}")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        if error["type"] == "missing":
            raise RecordError(f"{what}: {where}: missing") from None
        found = repr(error.get("input"))[:60]
        raise RecordError(f"{what}: {where}: {error['msg'].lower()}, found {found}") from None


def read_json_file(
    path: Path, what: str | None = None, *, max_bytes: int = MAX_RECORD_BYTES
) -> Any:
    """The JSON value of the file at `path` (called `what` in errors, default its path),
    bounded: its size is checked before it is read."""
    what = what or str(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise RecordError(f"{what}: {size} bytes, more than the {max_bytes} a record may hold")
        return parse_json(path.read_bytes(), what, max_bytes=max_bytes)
    except OSError as exc:
        raise RecordError(f"{what}: cannot be read ({exc.strerror or exc})") from None


def check_json_lines(path: Path, what: str, *, max_bytes: int = MAX_LINES_BYTES) -> int:
    """Check that the file at `path` is UTF-8 JSON lines, one object a line (blank lines
    allowed), before it goes anywhere; the number of records. `what` names it in errors."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise RecordError(f"{what} {path}: {size} bytes, more than {max_bytes} allowed")
        data = path.read_bytes()
    except OSError as exc:
        raise RecordError(f"{what} {path}: cannot be read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise RecordError(
            f"{what} {path}: line {line}: not UTF-8 text (the byte {data[exc.start]:#04x}); "
            "save it as UTF-8 JSON lines"
        ) from None
    count = 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            value = parse_json(line, f"{what} {path}: line {number}")
            if not isinstance(value, dict):
                raise RecordError(
                    f"{what} {path}: line {number}: expected a JSON object, found "
                    f"{type(value).__name__}"
                )
            count += 1
    if not count:
        raise RecordError(f"{what} {path}: no records (expected one JSON object a line)")
    return count


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in `value`, counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((inner, depth + 1) for inner in _children(item))
    return deepest


def _children(item: dict | list) -> list:
    return list(item.values()) if isinstance(item, dict) else item
