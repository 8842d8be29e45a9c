"""Free-space checks: before a hop writes anything, the filesystem that will hold the file
must have room for the bytes still to write plus a margin.

The margin is max(`transfer.margin`, `transfer.margin_fraction` × bytes) from the inventory
(default max(1 GiB, 2 %)), so a full disk never ends a multi-GB transfer near its end, and the
host keeps some room for everything else that writes there.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_ops.core.errors import DiskSpaceError, InventoryError
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.transfer_settings import TransferSettings
from dflash_ops.core.units import format_bytes, parse_size


@dataclass(frozen=True)
class Margin:
    minimum: int
    fraction: float

    def for_bytes(self, count: int) -> int:
        return max(self.minimum, int(count * self.fraction))

    def describe(self) -> str:
        if not self.fraction:
            return format_bytes(self.minimum)
        return f"max({format_bytes(self.minimum)}, {self.fraction:.0%})"


def margin_of(inventory: Inventory, override: str | None = None) -> Margin:
    """The inventory's margin, or `override` (e.g. '--margin 2g': that size, no fraction)."""
    settings: TransferSettings = inventory.transfer
    text, fraction = (override, 0.0) if override else (settings.margin, settings.margin_fraction)
    try:
        return Margin(parse_size(text), fraction)
    except ValueError as exc:
        where = "--margin" if override else f"{inventory.path}: transfer.margin"
        raise InventoryError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class SpaceCheck:
    """One hop's answer: where, how much it will write, what it needs with the margin."""

    host: str
    path: str
    to_write: int
    needed: int
    free: int
    what: str
    advice: str = ""  # what to free when it does not fit (default: old staged checkpoints)

    @property
    def ok(self) -> bool:
        return self.free >= self.needed

    def describe(self) -> str:
        verdict = "ok" if self.ok else "NOT ENOUGH"
        return (
            f"{self.host}:{self.path}: writes {format_bytes(self.to_write)}, needs "
            f"{format_bytes(self.needed)} with margin, free {format_bytes(self.free)} ({verdict})"
        )

    def require(self) -> None:
        if not self.ok:
            raise DiskSpaceError(
                self.host, self.path, self.needed, self.free, self.what, self.advice
            )


def space_check(
    host: str, path: str, free: int, to_write: int, margin: Margin, what: str, advice: str = ""
) -> SpaceCheck:
    needed = to_write + margin.for_bytes(to_write) if to_write else 0
    return SpaceCheck(host, path, to_write, needed, free, what, advice)
