"""Parsing of command-line values shared by the front doors (Fabric tasks and the click CLI).

Kept apart from both so that neither front door imports the other.
"""

from __future__ import annotations

from dflash_ops.core.errors import OpsError


def parse_count(flag: str, text: str | int | None, minimum: int = 0) -> int | None:
    """A whole-number flag given as text (the tasks take numbers as text so that a bad value
    gets this one line instead of invoke's traceback); None when not given."""
    if text is None or text == "":
        return None
    value = str(text).strip()
    if not value.isdigit() or int(value) < minimum:
        raise OpsError(f"{flag}: expected a whole number ≥ {minimum}, found {text!r}")
    return int(value)


def one_of(*flags: tuple[str, object]) -> None:
    """Refuse flags that exclude each other (`--steps 2000 --step 4000` would run one):
    (flag, value) pairs; a value other than None, False, 0 or '' counts as given."""
    given = [flag for flag, value in flags if value not in (None, False, "", 0)]
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
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise OpsError(f"--steps: expected comma-separated integers, found {text!r}") from None
