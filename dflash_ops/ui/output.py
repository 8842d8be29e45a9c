"""Records as people or programs read them: a table that fits the terminal, JSON, CSV or
Markdown (`--format`).

A command builds its output as records (dicts of plain values: numbers stay numbers, a
missing value is None) and the Columns that show them to people. JSON and CSV carry every
key of the records as it is; the table and Markdown show the columns' text, so for those a
record may be any value its columns read (compare's typed records). The table leaves out
the least important columns, naming them below it, until it fits the console's width; a
`wide` table keeps them all and wraps its cells instead.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from dflash_ops.core.arguments import parse_choice
from dflash_ops.core.text import csv_cell, inert
from dflash_ops.ui.console import shown

FORMATS = ("table", "json", "csv", "markdown")
FORMAT_HELP = "output as table (default), json, csv or markdown"


R = TypeVar("R")  # a record: a dict of plain values, or a typed record its columns read


def text(value: object) -> str:
    """A plain value as a cell's text ('-' when missing)."""
    return "-" if value is None else str(value)


def field(key: str) -> Callable[[dict[str, Any]], str]:
    """A record's `key` as text ('-' when missing)."""
    return lambda record: text(record.get(key))


@dataclass(frozen=True)
class Column(Generic[R]):
    title: str
    show: Callable[[R], str]  # the cell's text, from the whole record
    keep: int = 0  # the narrower the terminal, the more of the lowest `keep` are left out
    right: bool = False  # numbers are right-aligned


def parse_format(value: str | None) -> str:
    return parse_choice("--format", value or "table", FORMATS)


def render(
    records: Sequence[R],
    columns: Sequence[Column[R]],
    fmt: str,
    *,
    console: Console,
    title: str = "",
    wide: bool = False,
    style: Callable[[R], str | None] = lambda record: None,
) -> None:
    """Print `records` in `fmt` on `console` (json and csv: dicts). `style(record)`: a rich
    style for a table row."""
    if fmt in ("json", "csv", "markdown"):
        # Never wrapped, never marked up: what a program reads back is what was written.
        plain = {"json": as_json, "csv": as_csv, "markdown": as_markdown}[fmt]
        console.print(plain(records, columns), end="", markup=False, soft_wrap=True)
    else:
        console.print(fitted_table(records, columns, console, title, wide, style))


def as_json(records: Sequence[dict[str, Any]], columns: Sequence[Column] = ()) -> str:
    return json.dumps(list(records), indent=2) + "\n"


def as_csv(records: Sequence[dict[str, Any]], columns: Sequence[Column] = ()) -> str:
    """Every key of the records (in their order), one line per record; '' for None; a text
    that a spreadsheet would take for a formula is written as text (core/text.py)."""
    keys = list(dict.fromkeys(key for record in records for key in record))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(keys)
    for record in records:
        writer.writerow(["" if record.get(key) is None else csv_cell(record[key]) for key in keys])
    return out.getvalue()


def as_markdown(records: Sequence[R], columns: Sequence[Column[R]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(inert(cell).replace("|", "\\|") for cell in cells) + " |"

    rule = ["---:" if column.right else "---" for column in columns]
    rows = [line([c.title for c in columns]), "|" + "|".join(rule) + "|"]
    rows += [line([c.show(record) for c in columns]) for record in records]
    return "\n".join(rows) + "\n"


def fitted_table(
    records: Sequence[R],
    columns: Sequence[Column[R]],
    console: Console,
    title: str = "",
    wide: bool = False,
    style: Callable[[R], str | None] = lambda record: None,
) -> Table:
    """The columns, fewer until the table fits the console; a `wide` table wraps its cells
    instead of losing columns."""
    shown = list(columns)
    hidden: list[Column[R]] = []
    while True:
        table = _table(records, shown, title, style, wrap=wide)
        if wide or len(shown) <= 1 or _natural_width(table, console) <= console.width:
            break
        dropped = min(shown, key=lambda column: column.keep)
        shown.remove(dropped)
        hidden.insert(0, dropped)
    if hidden:
        names = ", ".join(column.title for column in hidden)
        table.caption = f"not shown at this width: {names} (--wide, or --format json)"
        table.caption_justify = "left"
    return table


def _natural_width(table: Table, console: Console) -> int:
    """The table's width with every cell on one line (measuring within the console's own
    width would clamp it to that)."""
    unbounded = console.options.update_width(UNBOUNDED)
    return Measurement.get(console, unbounded, table).maximum


UNBOUNDED = 100_000


def _table(
    records: Sequence[R],
    columns: Sequence[Column[R]],
    title: str,
    style: Callable[[R], str | None],
    wrap: bool,
) -> Table:
    table = Table(
        title=escape(title) if title else None,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for column in columns:
        table.add_column(
            escape(column.title),
            justify="right" if column.right else "left",
            no_wrap=not wrap,
            overflow="fold",
        )
    for record in records:
        # a cell is one line: a newline from a file would fake a row
        table.add_row(*(shown(c.show(record)) for c in columns), style=style(record))
    return table
