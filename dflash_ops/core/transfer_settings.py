"""The inventory's `transfer` section: free-space margins, keepalives, stall timeout,
priority and bandwidth of the transfers staging makes."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from dflash_ops.core.strict import Strict
from dflash_ops.core.units import MIN_BWLIMIT, format_bytes, parse_bwlimit


def _bandwidth(value: Any) -> int | None:
    try:
        return parse_bwlimit(value)
    except (ValueError, TypeError):
        raise ValueError(
            f"a bandwidth in bytes per second of at least {format_bytes(MIN_BWLIMIT)}/s, e.g. "
            "200m (= 200 MiB/s), or none"
        ) from None


class TransferSettings(Strict):
    """Free space kept beyond what a transfer writes: max(margin, margin_fraction × bytes);
    how fast a transfer may read (bytes per second; None: as fast as the links go)."""

    margin: str | int = "1g"
    margin_fraction: float = Field(default=0.02, ge=0, le=1)
    # Seconds between SSH keepalives; a link silent for KEEPALIVE_COUNT of them is dead.
    keepalive: int = Field(default=15, ge=1, le=3600)
    # Seconds an eval-side writer waits for bytes before it gives up and closes its file: a
    # dead link then leaves no writer holding the partial (or its space) on the host.
    stall_timeout: float = Field(default=60, ge=1, le=3600, allow_inf_nan=False)
    # The trainer-side readers at nice 19 / ionice idle (dflash_ops.remote.priority): false
    # lets a copy take its full share of the trainer's CPU and disk.
    low_priority: bool = True
    # Bytes per second a transfer may move ("200m"): gentle to the training host's disk and
    # links. --bwlimit overrides it (`with_bwlimit`).
    bwlimit: Annotated[int | None, BeforeValidator(_bandwidth)] = None
