"""What `fab prune` shows: every staged step with its verdict, then what was (or would be) freed."""

from __future__ import annotations

from rich.table import Table

from dflash_ops.core.arguments import parse_count, parse_steps
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.units import format_bytes
from dflash_ops.staging import prune
from dflash_ops.ui.console import console


def run_prune(
    inventory: Inventory,
    *,
    host: str | None,
    keep_last: str | None,
    keep_steps: str | None,
    yes: bool,
    run: str | None = None,
) -> None:
    policy = prune.Policy(
        keep_last=parse_count("--keep-last", keep_last, minimum=0) if keep_last else 2,
        keep_steps=frozenset(parse_steps(keep_steps) or ()),
    )
    judged = prune.plan(inventory, policy, host, run)
    table = Table(title="staged checkpoints", title_justify="left")
    for column in ("host", "run", "step", "size", "verdict"):
        table.add_column(column, justify="right" if column in ("step", "size") else "left")
    for item in judged:
        verdict = f"keep ({item.keep})" if item.keep else "[red]remove[/]"
        table.add_row(item.host, item.run or "-", str(item.step), format_bytes(item.size), verdict)
    console.print(table)
    dropped = [item for item in judged if item.keep is None]
    total = format_bytes(sum(item.size for item in dropped))
    if not dropped:
        console.print("nothing to remove")
    elif not yes:
        console.print(f"dry run: would free {total} ({len(dropped)} step(s)); pass --yes to remove")
    else:
        console.print(
            f"removed {len(dropped)} step(s), freed {format_bytes(prune.apply(inventory, dropped))}"
        )
