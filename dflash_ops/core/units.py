"""Human-readable sizes and durations for messages and tables."""

from __future__ import annotations


def format_bytes(count: float) -> str:
    """1536 -> '1.5 KiB'; exact below 1 KiB."""
    if abs(count) < 1024:
        return f"{int(count)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        count /= 1024
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.1f} {unit}"
    raise AssertionError("unreachable")


def parse_size(text: str | int) -> int:
    """'256m', '1.5G', '4096' -> bytes (binary units, as tmpfs and df use)."""
    if isinstance(text, int):
        return text
    value = text.strip().lower().removesuffix("ib").removesuffix("b")
    factor = 1
    if value and value[-1] in "kmgt":
        factor = 1024 ** ("kmgt".index(value[-1]) + 1)
        value = value[:-1]
    try:
        return int(float(value) * factor)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (expected e.g. 512m, 2g or a byte count)") from None
