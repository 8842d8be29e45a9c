"""What `fab prune` shows: every staged step (with --features: every feature set) with its
verdict, then what was (or would be) freed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.table import Table

from dflash_ops.core.arguments import MAX_COUNT, parse_count, parse_steps
from dflash_ops.core.errors import OpsError
from dflash_ops.core.inventory import EvalHost, Inventory
from dflash_ops.core.units import format_bytes
from dflash_ops.evaluation import jobs
from dflash_ops.features import prune as prune_sets
from dflash_ops.remote.connection import Host
from dflash_ops.staging import prune
from dflash_ops.ui.console import console, shown


def run_prune(
    inventory: Inventory,
    *,
    host: str | None,
    keep_last: str | None,
    keep_steps: str | None,
    yes: bool,
    run: str | None = None,
    features: bool = False,
    keep_sets: str | None = None,
) -> None:
    if features:
        if keep_steps or run:
            raise OpsError(
                "--features prunes feature sets, which have no step or training run: keep sets "
                "by id with --keep-sets ID,ID (and --keep-last N)"
            )
        run_prune_sets(inventory, host=host, keep_last=keep_last, keep_sets=keep_sets, yes=yes)
        return
    if keep_sets:
        raise OpsError("--keep-sets keeps feature sets: it needs --features")
    policy = prune.Policy(
        keep_last=_keep_last(keep_last),
        keep_steps=frozenset(parse_steps(keep_steps) or ()),
    )
    judged = prune.plan(inventory, policy, _steps_in_use, host, run)
    table = Table(title="staged checkpoints", title_justify="left")
    for column in ("host", "run", "step", "size", "verdict"):
        table.add_column(column, justify="right" if column in ("step", "size") else "left")
    for item in judged:
        verdict = f"keep ({item.keep})" if item.keep else "[red]remove[/]"
        names = (shown(item.host), shown(item.run or "-"))
        table.add_row(*names, str(item.step), format_bytes(item.size), verdict)
    console.print(table)
    _outcome(judged, "step(s)", yes, lambda dropped: prune.apply(inventory, dropped))


def _keep_last(text: str | None) -> int:
    """--keep-last N (default 2)."""
    found = parse_count("--keep-last", text, minimum=0, maximum=MAX_COUNT)
    return 2 if found is None else found


def _steps_in_use(host: Host, entry: EvalHost) -> set[str]:
    # A run reads {step dir}/checkpoint.pt or {step dir}/extracted: either way, its parent.
    return {
        str(Path(str(run.params.get("checkpoint", ""))).parent)
        for run in jobs.list_runs(host, entry)
        if not run.done
    }


def run_prune_sets(
    inventory: Inventory,
    *,
    host: str | None,
    keep_last: str | None,
    keep_sets: str | None,
    yes: bool,
) -> None:
    policy = prune_sets.SetPolicy(
        keep_last=_keep_last(keep_last),
        keep_sets=frozenset(part.strip() for part in (keep_sets or "").split(",") if part.strip()),
    )
    judged = prune_sets.plan(inventory, policy, host)
    table = Table(title="feature sets", title_justify="left")
    for column in ("host", "target", "set", "size", "verdict"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for item in judged:
        verdict = f"keep ({item.keep})" if item.keep else "[red]remove[/]"
        names = (shown(item.host), shown(item.target), shown(item.set_id))
        table.add_row(*names, format_bytes(item.size), verdict)
    console.print(table)
    _outcome(judged, "set(s)", yes, lambda dropped: prune_sets.apply(inventory, dropped))


def _outcome(judged: list, noun: str, yes: bool, remove: Callable[[list], int]) -> None:
    """Under the table: nothing to do, what a dry run would free, or what `remove` freed."""
    dropped = [item for item in judged if item.keep is None]
    if not dropped:
        console.print("nothing to remove")
    elif not yes:
        total = format_bytes(sum(item.size for item in dropped))
        console.print(f"dry run: would free {total} ({len(dropped)} {noun}); pass --yes to remove")
    else:
        console.print(f"removed {len(dropped)} {noun}, freed {format_bytes(remove(dropped))}")
