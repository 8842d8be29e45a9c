"""Whether a JSON value is a results file of this schema, checked against the types in
schema.py: every key they require is there and every value has its type (keys the types do
not name pass: a newer harness may add some). Stdlib only.

A reader calls `parse_results` once, on loading; every field the types promise can then be
read without `.get` or a try.
"""

from __future__ import annotations

import functools
import math
import types
from typing import (
    Any,
    Literal,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from dflash_eval.contract import schema
from dflash_eval.contract.errors import HarnessError

ADVICE = "the file is damaged, or was written by a dflash-ops of another version"


class SchemaError(HarnessError):
    """A results file that does not match the types of schema.py."""


def parse_results(value: Any) -> schema.Results:
    """`value` as Results, or SchemaError naming the first field that is missing or wrong."""
    if not isinstance(value, dict) or value.get("kind") != schema.KIND:
        raise SchemaError(f"not a dflash-eval results file ('kind' is not {schema.KIND!r})")
    if value.get("schema_version") not in schema.READABLE_SCHEMA_VERSIONS:
        readable = ", ".join(map(str, schema.READABLE_SCHEMA_VERSIONS))
        raise SchemaError(
            f"schema_version {value.get('schema_version')!r}, this dflash-ops reads "
            f"{readable}: compare it with the dflash-ops that wrote it"
        )
    check(value, schema.Results, "results")
    return cast(schema.Results, value)


def check(value: Any, expected: Any, where: str) -> None:
    """Raise SchemaError unless `value` has the type `expected` (a TypedDict, a union, a
    Literal, list[…], dict[str, …], a plain type or Any); `where` names it in the message."""
    origin = get_origin(expected)
    if expected is Any:
        return
    if is_typeddict(expected):
        _check_record(value, expected, where)
    elif origin in (Union, types.UnionType):
        _check_union(value, get_args(expected), where)
    elif origin is Literal:
        if value not in get_args(expected):
            _fail(where, " | ".join(repr(v) for v in get_args(expected)), value)
    elif origin is list:
        if not isinstance(value, list):
            _fail(where, "a list", value)
        for index, item in enumerate(value):
            check(item, get_args(expected)[0], f"{where}[{index}]")
    elif origin is dict:
        if not isinstance(value, dict):
            _fail(where, "an object", value)
        for key, item in value.items():
            check(item, get_args(expected)[1], f"{where}.{key}")
    elif not _is_instance(value, expected):
        _fail(where, _describe(expected), value)


def _check_record(value: Any, expected: Any, where: str) -> None:
    if not isinstance(value, dict):
        _fail(where, f"an object ({expected.__name__})", value)
    missing = sorted(expected.__required_keys__ - value.keys())
    if missing:
        raise SchemaError(f"{where}: no {', '.join(missing)} ({ADVICE})")
    for key, hint in _hints(expected).items():
        if key in value:
            check(value[key], hint, f"{where}.{key}")


def _check_union(value: Any, options: tuple[Any, ...], where: str) -> None:
    if value is None and type(None) in options:
        return
    present = [option for option in options if option is not type(None)]
    if len(present) == 1:  # X | None: check X, so that a deep mismatch is named
        check(value, present[0], where)
        return
    for option in present:
        try:
            check(value, option, where)
        except SchemaError:
            continue
        return
    named = [o for o in options if not (o is int and float in options)]  # float takes ints
    _fail(where, " | ".join(_describe(option) for option in named), value)


@functools.cache
def _hints(record: Any) -> dict[str, Any]:
    return get_type_hints(record)


def _is_instance(value: Any, expected: type) -> bool:
    if isinstance(value, bool):  # JSON true is no number
        return expected is bool
    if expected is float:  # 1e400 reads back as inf: no number any field can hold
        return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    if expected is type(None):
        return value is None
    return isinstance(value, expected)


def _describe(expected: Any) -> str:
    if expected is type(None):
        return "null"
    if expected is float:
        return "a finite number"
    return getattr(expected, "__name__", None) or str(expected)


def _fail(where: str, expected: str, found: Any) -> None:
    shown = repr(found)
    shown = shown if len(shown) <= 40 else shown[:39] + "…"
    raise SchemaError(
        f"{where}: expected {expected}, found {type(found).__name__} {shown} ({ADVICE})"
    )
