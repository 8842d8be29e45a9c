"""The harness's one parser of numbers from outside: command-line options and the numeric
values of a drafter or target config. Each is finite, within its bounds and, where it must
be, whole; a bad one is one HarnessError line naming it, its unit and its bounds, before
anything is allocated from it (a `num_hidden_layers` of 10**12 would otherwise be a list
of 10**12 layer types). The workstation's equivalent is dflash_ops.core.arguments.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from dflash_eval.errors import HarnessError

_WHOLE = re.compile(r"[+-]?\d+")


def parse_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    whole: bool = False,
    unit: str = "",
    text: bool = True,
) -> Any:
    """`value` (a number, or its text unless `text` is False) checked: an int when `whole`,
    else a float."""
    expected = _expected(minimum, maximum, whole, unit)
    number = None if isinstance(value, str) and not text else _number(value, whole)
    if number is None or (minimum is not None and number < minimum):
        raise HarnessError(f"{name}: expected {expected}, found {value!r}")
    if maximum is not None and number > maximum:
        raise HarnessError(f"{name}: expected {expected}, found {value!r}")
    return number


def option(
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    whole: bool = True,
    unit: str = "",
) -> Callable[[str], Any]:
    """An argparse `type` for a numeric option with these bounds (argparse names the flag)."""

    def convert(text: str) -> Any:
        try:
            return parse_number(
                "value", text, minimum=minimum, maximum=maximum, whole=whole, unit=unit
            )
        except HarnessError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix("value: ")) from None

    return convert


def check_numbers(
    raw: Mapping[str, Any], bounds: Mapping[str, tuple[float, float, bool]], where: str
) -> None:
    """Each key of `bounds` that `raw` holds (not null) within (minimum, maximum, whole), a
    JSON number (a config's text is no number: transformers would refuse it later)."""
    for key, (low, high, whole) in bounds.items():
        if raw.get(key) is not None:
            parse_number(
                f"{where}: {key}", raw[key], minimum=low, maximum=high, whole=whole, text=False
            )


def _number(value: Any, whole: bool) -> int | float | None:
    """The number `value` holds (None: none, or not finite, or not whole when it must be)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        if whole and _WHOLE.fullmatch(text):
            return int(text)  # exact, however long: the bounds judge it
        try:
            value = float(text)
        except ValueError:
            return None
    if isinstance(value, int):
        return value
    if not isinstance(value, float) or not math.isfinite(value):
        return None
    if whole:
        return int(value) if value.is_integer() else None
    return value


def _expected(minimum: float | None, maximum: float | None, whole: bool, unit: str) -> str:
    kind = "a whole number" if whole else "a finite number"
    if minimum is not None and maximum is not None:
        kind += f" from {_shown(minimum)} to {_shown(maximum)}"
    elif minimum is not None:
        kind += f" ≥ {_shown(minimum)}"
    elif maximum is not None:
        kind += f" ≤ {_shown(maximum)}"
    return f"{kind} {unit}".rstrip()


def _shown(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"
