"""Terminal output shared by the tasks: one rich Console, tables, and error printing.

Whatever the tasks print passes through `_Console.render_str`, which escapes control
characters (core/text.py: `inert`) before rich reads the text: a name, a log line or an error
that quotes one reaches the terminal as data, never as an escape sequence. Text put into
markup is escaped by the view that puts it there (`shown`), so that a name like `[red]`
prints as itself.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from dflash_ops.core.text import inert
from dflash_ops.remote.checks import Row, Status

# A line written to a pipe or a file is read by grep, a log or a test: it is never wrapped.
UNWRAPPED_WIDTH = 10_000


def shown(text: object, *, lines: bool = False) -> str:
    """`text` (a name, a message from a host) as it goes into rich markup: control
    characters escaped (`lines`: but for newline and tab), brackets literal."""
    return escape(inert(str(text), lines=lines))


class _Console(Console):
    """Wraps to the terminal's width (or COLUMNS) only when writing to a terminal; escapes
    control characters in all it prints (newline and tab kept: they are layout)."""

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(inert(text, lines=True), **options)

    @property
    def size(self) -> ConsoleDimensions:
        measured = super().size
        if self.is_terminal:
            return measured
        return ConsoleDimensions(UNWRAPPED_WIDTH, measured.height)


# No emoji codes either: `:fire:` in a name stays those six characters.
console = _Console(highlight=False, emoji=False)
errors = _Console(stderr=True, highlight=False, emoji=False)

_STATUS_STYLE = {
    Status.OK: "[green]✓ ok[/]",
    Status.FAIL: "[bold red]✗ FAIL[/]",
    Status.WARN: "[yellow]! warn[/]",
    Status.INFO: "[cyan]· info[/]",
    Status.SKIPPED: "[dim]- skipped[/]",
}


def check_summary(rows: list[Row], title: str) -> Table:
    """`fab check-hosts` without -v: per host one line for the checks that passed, by name,
    then each that did not (warn, fail, skipped) with its detail; the facts (info) are left
    to -v. Short enough for one screen at 80 columns."""
    table = Table(title=title, title_justify="left", box=None, show_header=False)
    table.add_column("host", style="bold", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("check", overflow="fold")
    for host in dict.fromkeys(row.host for row in rows):
        own = [row for row in rows if row.host == host]
        passed = [row.check for row in own if row.status is Status.OK]
        lines = [(_STATUS_STYLE[Status.OK], escape(", ".join(passed)))] if passed else []
        lines += [
            (_STATUS_STYLE[row.status], f"[bold]{escape(row.check)}[/]: {escape(row.detail)}")
            for row in own
            if row.status not in (Status.OK, Status.INFO)
        ]
        for number, (status, text) in enumerate(lines):
            table.add_row(shown(host) if number == 0 else "", status, text)
    return table


def check_table(rows: list[Row], title: str) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("host", style="bold")
    table.add_column("check")
    table.add_column("status", no_wrap=True)
    table.add_column("detail", overflow="fold")
    previous = None
    for row in rows:
        table.add_row(
            shown(row.host) if row.host != previous else "",
            escape(row.check),
            _STATUS_STYLE[row.status],
            escape(row.detail),
            end_section=False,
        )
        previous = row.host
    return table
