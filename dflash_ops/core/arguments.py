"""Parsing of command-line values shared by the front doors (Fabric tasks and the click CLI).

Kept apart from both so that neither front door imports the other. Every number goes through
the harness's one parser (dflash_eval.contract.numbers) and has both bounds, far beyond real use.
"""

from __future__ import annotations

from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.numbers import parse_number as harness_number
from dflash_eval.contract.options import MAX_PROMPTS, MAX_STEP

from dflash_ops.core.errors import OpsError

__all__ = ["MAX_COUNT", "MAX_PROMPTS", "MAX_RETRIES", "MAX_STEP"]  # the tasks' bounds too
MAX_COUNT = 1_000_000  # passes, groups, kept steps or sets: beyond any real use
MAX_RETRIES = 1000


def parse_number(
    flag: str,
    text: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    whole: bool = False,
    unit: str = "",
) -> Any:
    """The one parser of numbers given from outside (options, config values), shared with
    the harness (dflash_eval.contract.numbers): finite, within the bounds, whole when `whole`; a bad
    one is an OpsError naming the flag, the unit and the bounds."""
    try:
        return harness_number(flag, text, minimum=minimum, maximum=maximum, whole=whole, unit=unit)
    except HarnessError as error:
        raise OpsError(str(error)) from None


def parse_count(
    flag: str, text: str | int | None, *, minimum: int, maximum: int, unit: str = ""
) -> int | None:
    """A whole-number flag given as text (the tasks take numbers as text so that a bad value
    gets this one line instead of invoke's traceback); None when not given (an empty text is
    refused: it is no number)."""
    if text is None:
        return None
    return parse_number(flag, text, minimum=minimum, maximum=maximum, whole=True, unit=unit)


def parse_step(text: str | int | None, flag: str = "--step") -> int | None:
    """A training step (the harness's --step has the same bounds); None when not given."""
    return parse_count(flag, text, minimum=0, maximum=MAX_STEP)


def one_of(*flags: tuple[str, object]) -> None:
    """Refuse flags that exclude each other (`--steps 2000 --step 4000` would run one):
    (flag, value) pairs; a value other than None, False or '' counts as given (0 does:
    `--step 0` names step 0)."""
    given = [flag for flag, value in flags if not (value is None or value is False or value == "")]
    if len(given) > 1:
        raise OpsError(f"{' and '.join(given)} exclude each other: pass one of them")


def parse_choice(flag: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise OpsError(f"{flag}: expected one of {', '.join(allowed)}, found {value!r}")
    return value


def parse_steps(text: str | None) -> list[int] | None:
    """`--steps 2000,4000` → [2000, 4000]; None when not given."""
    if not text:
        return None
    return [parse_step(part, "--steps") for part in text.split(",") if part.strip()]
