"""Parsing of command-line values shared by the front doors (Fabric tasks and the click CLI).

Kept apart from both so that neither front door imports the other.
"""

from __future__ import annotations

from dflash_ops.core.errors import OpsError


def parse_steps(text: str | None) -> list[int] | None:
    """`--steps 2000,4000` → [2000, 4000]; None when not given."""
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise OpsError(f"--steps: expected comma-separated integers, found {text!r}") from None
