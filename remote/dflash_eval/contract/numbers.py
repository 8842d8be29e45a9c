"""The one parser of numbers from outside, for the harness and the workstation alike:
command-line options (the run options of dflash_eval.contract.options and the workstation's own
flags, through dflash_ops.core.arguments) and the numeric values of a drafter or target
config. Each is finite, within its bounds and, where it must be, whole; a bad one is one
HarnessError line naming it, the range with its unit, and what was found, before anything
is allocated from it (a `num_hidden_layers` of 10**12 would otherwise be a list of 10**12
layer types).

Text is plain decimal notation in ASCII (`12`, `-0.5`, `1e3`): no hex, no underscores, no
other scripts' digits, no `inf`/`nan`, and at most MAX_DIGITS characters, so that a number
means the same to every reader of it and no text is too long to convert.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from dflash_eval.contract.errors import HarnessError

_WHOLE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
MAX_DIGITS = 100  # far more than any bound needs; int() refuses over 4300 digits anyway


def parse_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    whole: bool = False,
    unit: str = "",
    text: bool = True,
    above_minimum: bool = False,
) -> Any:
    """`value` (a number, or its text unless `text` is False) checked: an int when `whole`,
    else a float; `above_minimum`: the minimum itself is refused."""
    number = None if isinstance(value, str) and not text else _number(value, whole)
    if number is None or not _within(number, minimum, maximum, above_minimum):
        expected = (
            ("a whole number" if whole else "a finite number")
            + " "
            + span(minimum, maximum, unit, above_minimum)
        )
        raise HarnessError(f"{name}: expected {expected.rstrip()}, found {shown_value(value)}")
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


def span(
    minimum: float | None, maximum: float | None, unit: str = "", above_minimum: bool = False
) -> str:
    """A range in words, as errors and help show it: "from 1 to 1024 tokens", "≥ 0",
    "> 0 and ≤ 1", or "" when unbounded."""
    low = None if minimum is None else f"{'>' if above_minimum else '≥'} {_shown(minimum)}"
    if minimum is not None and maximum is not None:
        words = (
            f"{low} and ≤ {_shown(maximum)}"
            if above_minimum
            else f"from {_shown(minimum)} to {_shown(maximum)}"
        )
    else:
        words = low or ("" if maximum is None else f"≤ {_shown(maximum)}")
    return f"{words} {unit}".strip()


def _within(
    number: float, minimum: float | None, maximum: float | None, above_minimum: bool
) -> bool:
    if minimum is not None and (number <= minimum if above_minimum else number < minimum):
        return False
    return maximum is None or number <= maximum


def _number(value: Any, whole: bool) -> int | float | None:
    """The number `value` holds (None: none, or not finite, or not whole when it must be)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        if len(text) > MAX_DIGITS or not _DECIMAL.fullmatch(text):
            return None
        if whole and _WHOLE.fullmatch(text):
            return int(text)  # exact: the bounds judge it
        value = float(text)
    if isinstance(value, int):
        return value
    if not isinstance(value, float) or not math.isfinite(value):
        return None
    if whole:
        return int(value) if value.is_integer() else None
    return value + 0.0  # -0.0 is 0


def shown_value(value: Any) -> str:
    """The value as the message shows it: whole, unless it would swamp the line."""
    if isinstance(value, str) and len(value) > MAX_DIGITS:
        return f"{value[:24]!r}… ({len(value)} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"a whole number of {len(str(abs(value)))} digits"
    return repr(value)


def _shown(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"
