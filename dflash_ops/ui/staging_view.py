"""What `fab list-checkpoints` and `fab stage-checkpoint` show: a table, a plan, progress bars."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import get_args

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from dflash_ops.core.arguments import parse_choice
from dflash_ops.core.errors import HostError, InventoryError
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.units import format_bytes
from dflash_ops.staging.catalog import list_checkpoints
from dflash_ops.staging.destination import staged_status
from dflash_ops.staging.relay import ProgressCallback, RelayState
from dflash_ops.staging.sources import Via
from dflash_ops.staging.stage import StagedCheckpoint, StageOptions, stage
from dflash_ops.ui.console import console


def checkpoints_table(inventory: Inventory) -> Table:
    infos = list_checkpoints(inventory)
    run = f" (training run {inventory.training_run})" if inventory.training_run else ""
    table = Table(
        title=f"checkpoints on {inventory.trainer_name}:{inventory.trainer.checkpoints}{run}",
        title_justify="left",
    )
    for column in ("step", "size", "modified", "complete"):
        table.add_column(column, justify="right" if column in ("step", "size") else "left")
    staged: dict[str, dict[int, str]] = {}
    for name in inventory.eval_hosts:
        table.add_column(f"on {name}")
        try:
            staged[name] = staged_status(inventory, name, infos)
        except HostError as exc:
            staged[name] = {info.step: f"[red]? {exc}[/]" for info in infos}
    for info in infos:
        files = f" ({len(info.members)} files)" if info.directory else ""
        table.add_row(
            str(info.step),
            format_bytes(info.size) + files,
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.mtime)),
            "[green]yes[/]" if info.complete else "[yellow]no (being written?)[/]",
            *(_styled(staged[name][info.step]) for name in inventory.eval_hosts),
        )
    if not infos:
        table.caption = "no checkpoints match the inventory's layout " + inventory.trainer.layout
    return table


def _styled(status: str) -> str:
    if status == "staged":
        return "[green]✓ staged[/]"
    if status == "weights":
        return "[green]✓ weights only[/]"
    if status == "stale":
        return "[yellow]stale copy[/]"
    return status or "-"


def run_stage(
    inventory: Inventory,
    *,
    step: int | None,
    latest: bool,
    to: list[str] | None,
    dry_run: bool,
    via: str,
    two_hop: bool,
    resume: bool,
    verify: bool,
    margin: str | None,
    weights_only: bool = False,
) -> list[StagedCheckpoint]:
    parse_choice("--via", via, get_args(Via))
    if step is None and not latest:
        raise InventoryError("pass --step N or --latest")
    with transfer_bars() as factory:
        options = StageOptions(
            via=via,
            two_hop=two_hop,
            resume=resume,
            verify=verify,
            dry_run=dry_run,
            margin=margin,
            weights_only=weights_only,
            report=console.print,
            progress_factory=factory,
        )
        results = stage(inventory, step, to, latest=latest, options=options)
    if dry_run:
        console.print("[bold]plan (dry run, nothing written):[/]")
        for hop in (hop for staged in results for hop in staged.plan):
            console.print(f"  {hop.describe()}")
        console.print(f"  {gentleness_plan(inventory)}")
    elif weights_only:
        console.print(_weights_summary(results))
    return results


def gentleness_plan(inventory: Inventory) -> str:
    """How a stage will spare the trainer (what each transfer then reports it did)."""
    limit = inventory.transfer.bwlimit
    pace = f"at most {format_bytes(limit)}/s" if limit else "no bwlimit"
    return f"each transfer: {pace}; the trainer's reader at nice 19, ionice idle where they exist"


@contextmanager
def transfer_bars() -> Iterator[Callable[[str, int], ProgressCallback]]:
    """While held: a progress bar (bytes, speed, time left) for each transfer the yielded
    factory is asked for, by its label and total bytes. Lines printed on `console` meanwhile
    appear above the bars."""
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as progress:

        def factory(label: str, total: int) -> ProgressCallback:
            task = progress.add_task(label, total=total)

            def advance(state: RelayState) -> None:
                progress.update(task, completed=state.done)

            return advance

        yield factory


def _weights_summary(results: list[StagedCheckpoint]) -> str:
    """What --weights-only saved: the copy's size against the trainer's checkpoint."""
    extracted = [r for r in results if r.kind == "extracted"]
    if not extracted:
        return "[yellow]the whole checkpoint was staged (see above why)[/]"
    copy = extracted[0]
    saved = copy.source_size - copy.size
    share = saved * 100 // copy.source_size if copy.source_size else 0
    return (
        f"weights only: {format_bytes(copy.size)} staged of a {format_bytes(copy.source_size)} "
        f"checkpoint ({format_bytes(saved)}, {share}% not moved)"
    )
