"""Terminal output shared by the tasks: one rich Console, tables, and error printing."""

from __future__ import annotations

from rich.console import Console, ConsoleDimensions
from rich.table import Table

from dflash_ops.remote.checks import Row, Status

# A line written to a pipe or a file is read by grep, a log or a test: it is never wrapped.
UNWRAPPED_WIDTH = 10_000


class _Console(Console):
    """Wraps to the terminal's width (or COLUMNS) only when writing to a terminal."""

    @property
    def size(self) -> ConsoleDimensions:
        measured = super().size
        if self.is_terminal:
            return measured
        return ConsoleDimensions(UNWRAPPED_WIDTH, measured.height)


console = _Console(highlight=False)
errors = _Console(stderr=True, highlight=False)

_STATUS_STYLE = {
    Status.OK: "[green]✓ ok[/]",
    Status.FAIL: "[bold red]✗ FAIL[/]",
    Status.WARN: "[yellow]! warn[/]",
    Status.INFO: "[cyan]· info[/]",
    Status.SKIPPED: "[dim]- skipped[/]",
}


def check_table(rows: list[Row], title: str) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("host", style="bold")
    table.add_column("check")
    table.add_column("status", no_wrap=True)
    table.add_column("detail", overflow="fold")
    previous = None
    for row in rows:
        table.add_row(
            row.host if row.host != previous else "",
            row.check,
            _STATUS_STYLE[row.status],
            row.detail,
            end_section=False,
        )
        previous = row.host
    return table
