"""What `fab list-checkpoints` and `fab stage-checkpoint` show: a table, a plan, progress bars."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import get_args

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Column as RichColumn

from dflash_ops.core.arguments import one_of, parse_choice
from dflash_ops.core.errors import HostError, InventoryError
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.units import format_bytes
from dflash_ops.staging.catalog import list_checkpoints
from dflash_ops.staging.delivery import StagedCheckpoint, StageOptions
from dflash_ops.staging.destination import staged_status
from dflash_ops.staging.relay import ProgressCallback, RelayState
from dflash_ops.staging.sources import Via
from dflash_ops.staging.stage import stage
from dflash_ops.ui.console import console, shown
from dflash_ops.ui.output import Column, field, parse_format, render


def checkpoint_records(inventory: Inventory) -> list[dict]:
    """The trainer's checkpoints as plain values (`list-checkpoints --format json|csv`):
    step, bytes, files, mtime, completeness, and `on_<host>` for each eval host."""
    infos = list_checkpoints(inventory)
    staged: dict[str, dict[int, str]] = {}
    for name in inventory.eval_hosts:
        try:
            staged[name] = staged_status(inventory, name, infos)
        except HostError as exc:
            staged[name] = {info.step: f"? {exc}" for info in infos}
    return [
        {
            "step": info.step,
            "size_bytes": info.size,
            "files": len(info.members) if info.directory else None,
            "modified": info.mtime,
            "complete": info.complete,
            **{f"on_{name}": staged[name][info.step] or None for name in inventory.eval_hosts},
        }
        for info in infos
    ]


def show_checkpoints(inventory: Inventory, fmt: str = "table", wide: bool = False) -> None:
    """`fab list-checkpoints`."""
    records = checkpoint_records(inventory)
    fmt = parse_format(fmt)
    run = f" (training run {inventory.training_run})" if inventory.training_run else ""
    if not records and fmt == "table":
        console.print(
            f"no checkpoints on {inventory.trainer_name}:{inventory.trainer.checkpoints}{run} "
            f"match the inventory's layout {inventory.trainer.layout}"
        )
        return
    columns = [
        Column("step", field("step"), keep=10, right=True),
        Column("size", _size, keep=8, right=True),
        Column(
            "modified",
            lambda r: time.strftime("%Y-%m-%d %H:%M", time.localtime(r["modified"])),
            keep=4,
        ),
        Column("complete", lambda r: "yes" if r["complete"] else "no (being written?)", keep=7),
        *(
            Column(
                f"on {name}", lambda r, key=f"on_{name}": _STAGED.get(r[key], r[key] or "-"), keep=9
            )
            for name in inventory.eval_hosts
        ),
    ]
    title = f"checkpoints on {inventory.trainer_name}:{inventory.trainer.checkpoints}{run}"
    render(records, columns, fmt, console=console, title=title, wide=wide)


def _size(record: dict) -> str:
    files = f" ({record['files']} files)" if record["files"] is not None else ""
    return format_bytes(record["size_bytes"]) + files


_STAGED = {"staged": "✓ staged", "weights": "✓ weights only", "stale": "stale copy"}


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
    one_of(("--step", step), ("--latest", latest))
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


LABEL_WIDTH = 24  # a transfer's label: with bar, bytes, rate and time left, about 78 columns


@contextmanager
def transfer_bars(
    on: Console | None = None,
) -> Iterator[Callable[[str, int], ProgressCallback]]:
    """While held: a progress bar (bytes, speed, time left) for each transfer the yielded
    factory is asked for, by its label (shortened: `short_label`) and total bytes. Lines
    printed on the console meanwhile appear above the bars."""
    with Progress(
        TextColumn("{task.description}", table_column=RichColumn(width=LABEL_WIDTH, no_wrap=True)),
        BarColumn(bar_width=10),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=on or console,
        transient=False,
    ) as progress:

        def factory(label: str, total: int) -> ProgressCallback:
            task = progress.add_task(shown(short_label(label)), total=total)

            def advance(state: RelayState) -> None:
                progress.update(task, completed=state.done)

            return advance

        yield factory


def short_label(label: str, width: int = LABEL_WIDTH) -> str:
    """`host:/long/path/step_4000/checkpoint.pt` → `host:step_4000/checkpoint.pt`, and then,
    if still too long, its end after an ellipsis: the step and file are what tell bars apart."""
    host, colon, path = label.rpartition(":")
    tail = "/".join(path.rstrip("/").split("/")[-2:])
    short = f"{host}{colon}{tail}"
    return short if len(short) <= width else "…" + short[-(width - 1) :]


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
