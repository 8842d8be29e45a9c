"""Human-readable sizes and durations for messages and tables."""

from __future__ import annotations

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.numbers import parse_number, shown_value


def format_bytes(count: float) -> str:
    """1536 -> '1.5 KiB'; exact below 1 KiB."""
    if abs(count) < 1024:
        return f"{int(count)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        count /= 1024
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.1f} {unit}"
    raise AssertionError("unreachable")


MAX_SIZE = 1 << 60  # 1 EiB: no disk, margin or rate of ours is larger


def parse_size(text: str | int) -> int:
    """'256m', '1.5G', '4096' -> bytes (binary units, as tmpfs and df use), from 0 to 1 EiB."""
    value = str(text).strip().lower().removesuffix("ib").removesuffix("b")
    factor = 1
    if value and value[-1] in "kmgt":
        factor = 1024 ** ("kmgt".index(value[-1]) + 1)
        value = value[:-1]
    try:
        return int(parse_number("size", value, minimum=0, maximum=MAX_SIZE / factor) * factor)
    except HarnessError:
        raise ValueError(
            f"not a size: {shown_value(text)} (expected e.g. 512m, 2g or a byte count, at most "
            "1 EiB)"
        ) from None


MIN_BWLIMIT = 64 * 1024  # below this a 15 GB checkpoint takes days: surely a typo
UNLIMITED = ("", "0", "none", "off", "unlimited")


def parse_bwlimit(text: str | int | None) -> int | None:
    """A transfer's bandwidth limit in bytes per second: '200m' (binary units, as
    `parse_size`; an optional '/s' is allowed) -> 209715200; None, 0 or 'none' -> no limit."""
    if text is None or str(text).strip().lower() in UNLIMITED:
        return None
    try:
        rate = parse_size(str(text).strip().lower().removesuffix("/s"))
    except ValueError:
        raise ValueError(
            f"not a bandwidth: {shown_value(text)} (expected bytes per second from "
            f"{MIN_BWLIMIT >> 10} KiB/s to 1 EiB/s, e.g. 200m or 50m/s; 'none' for no limit)"
        ) from None
    if rate < MIN_BWLIMIT:
        raise ValueError(
            f"bandwidth {text!r} is {format_bytes(rate)}/s, under the smallest useful limit of "
            f"{format_bytes(MIN_BWLIMIT)}/s (units are bytes per second: 200m = 200 MiB/s)"
        )
    return rate
