"""`fab report`: one self-contained static HTML file of a comparison.

Everything is inside the file (figures as inline SVG, styles inline, no script, no link to
anything): it can be mailed, archived or opened offline. It opens with the key numbers of
the latest comparable run and a table of contents; then τ vs step with 95 % confidence
intervals, the comparison table with its comparability flags, the per-prompt-set table and
whether consecutive steps' intervals overlap, the acceptance-length histogram, per-position
acceptance and DDTree τ by budget (with intervals), the pulled `fab diagnose` results of the
runs' checkpoints, the provenance facts that differ between runs (the shared ones folded:
report_facts.py) and the decoded samples with the accepted prefix marked (report_samples.py).
Runs of other comparability groups are shown, flagged, and left out of the figures.
`fab compare` rewrites it too.

Every value read from results reaches the page through an autoescaping Jinja2 template
(templates/report.html.j2): these modules build plain data, the template the markup, and
nothing from a results file is ever marked safe (only the SVG matplotlib wrote is).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
from dflash_eval.contract.reading import COMPARABILITY
from markupsafe import Markup

from dflash_ops.core.files import write_atomic
from dflash_ops.evaluation import figures
from dflash_ops.evaluation.compare_rows import (
    TRAINING_RUN,
    dataset_rows,
    overlap_notes,
    table_rows,
)
from dflash_ops.evaluation.results import Comparison
from dflash_ops.evaluation.served_records import MATCHING, SERVED_HEADER, served_cells
from dflash_ops.ui import report_diagnosis, report_facts, report_samples, training_view
from dflash_ops.ui.report_facts import short

REPORT_NAME = "report.html"
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222;
  padding: 0 1em; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; white-space: nowrap; }
.scroll { overflow-x: auto; }
th { background: #f0f0f0; } td.text, th.text { text-align: left; }
tr.flagged td { background: #fff0f0; } .flag { color: #b00; font-weight: bold; }
.banner { background: #fff4e0; border: 1px solid #e0a040; padding: 0.5em 1em; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
details { margin: 0.5em 0; } summary { cursor: pointer; font-weight: bold; }
code, pre { font-family: ui-monospace, monospace; font-size: 0.9em; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; background: #f7f7f7; padding: 0.5em; }
.cards { display: flex; flex-wrap: wrap; gap: 0.75em; margin: 1em 0; }
.card { border: 1px solid #ccc; border-radius: 6px; padding: 0.4em 0.7em; min-width: 7.5em;
  flex: 1 1 7.5em; background: #fafafa; }
.card .label { font-size: 0.8em; color: #555; } .card .value { font-size: 1.6em; font-weight: 600; }
.card .note { font-size: 0.75em; color: #666; }
nav.toc ol { columns: 2 14em; margin: 0.5em 0; }
table.facts th.run { white-space: normal; min-width: 10em; vertical-align: bottom; }
table.facts td, table.facts th { text-align: left; }
table.facts td { white-space: normal; overflow-wrap: anywhere; min-width: 8em; max-width: 30em; }
.sample { border-left: 3px solid #ddd; padding-left: 1em; margin: 1em 0; }
.sample h3 { font-size: 1em; margin: 0.3em 0; } .set { color: #555; font-weight: normal; }
.round { margin: 0.6em 0; } .round-head { font-size: 0.85em; color: #444; }
.tokens { font-family: ui-monospace, monospace; font-size: 0.85em; line-height: 1.9; }
.who { display: inline-block; width: 4em; color: #666; font-family: system-ui, sans-serif; }
.tok { white-space: pre; border: 1px solid #ddd; border-radius: 3px; padding: 0 2px;
  margin-right: 1px; }
.tok.ok { background: #d8f5d0; border-color: #7fc46b; }
.tok.miss { background: #ffd6d6; border-color: #d04040; text-decoration: line-through; }
.tok.want { background: #dce8ff; border-color: #5a7fd0; font-weight: 600; }
.tok.rest { color: #999; }
.legend .tok { font-family: ui-monospace, monospace; font-size: 0.85em; }
"""


def write(
    comparison: Comparison,
    path: Path,
    mixed: str | None = None,
    training_metric: str | None = None,
    diagnoses: list[tuple[str, dict[str, Any] | str]] | None = None,
    served: list[dict[str, Any]] | None = None,
) -> Path:
    """Render the comparison into `path` (atomically; its directory must exist) and return
    it."""
    html = render(comparison, mixed, training_metric, diagnoses, served)
    return write_atomic(path, html, make_parents=False)


_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("dflash_ops.ui", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,  # a misspelt name fails the render, never prints ""
)


def render(
    comparison: Comparison,
    mixed: str | None = None,
    training_metric: str | None = None,
    diagnoses: list[tuple[str, dict[str, Any] | str]] | None = None,
    served: list[dict[str, Any]] | None = None,
) -> str:
    """The whole HTML document (`training_metric`: the one drawn beside τ, default the first
    logged; `diagnoses`: those pulled, report_diagnosis.pulled; `served`: served τ beside
    CPU τ, served_records.side_by_side)."""
    # matplotlib escapes the text it puts into its SVG: the one markup trusted as such.
    built = figures.build(comparison, training_metric)
    charts = {name: Markup(figures.svg_text(f)) for name, f in built.items()}
    context = {
        "style": Markup(STYLE),
        "charts": charts,
        "run_count": len(comparison.rows),
        "steps": ", ".join(str(r.step) for r in comparison.rows),
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "mixed": mixed,
        "key_numbers": report_facts.key_numbers(comparison),
        "comparison": _comparison_table(comparison),
        "datasets": _datasets(comparison),
        "comparability": _comparability(comparison),
        "diagnoses": [
            _diagnosis(d) for d in report_diagnosis.sections(comparison, diagnoses or [])
        ],
        "provenance": report_facts.provenance(comparison),
        "samples": report_samples.run_samples(comparison.rows),
        "training": training_view.report_section(comparison),
        "served": _served(served or []),
        "served_matching": MATCHING,
    }
    return _TEMPLATES.get_template("report.html.j2").render(context) + "\n"


def _served(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not rows:
        return None
    flagged = [not row["agree"] for row in rows]
    return _table(SERVED_HEADER, served_cells(rows), "served", flagged, {"agree", "served run"})


def _comparison_table(comparison: Comparison) -> dict[str, Any]:
    header, cells = table_rows(comparison)
    flagged = [row.run_id in comparison.differences for row in comparison.rows]
    text_columns = {"run", TRAINING_RUN, "host", "comparable"}
    return _table(header, cells, "comparison", flagged, text_columns=text_columns)


def _datasets(comparison: Comparison) -> dict[str, Any] | None:
    header, cells = dataset_rows(comparison)
    if not cells:
        return None
    settings = next(
        block["bootstrap"] for r in comparison.rows if (block := r.done.get("by_dataset"))
    )
    flagged = [row[0] in comparison.differences for row in cells]
    return {
        **{name: settings.get(name) for name in ("method", "unit", "resamples", "seed")},
        "table": _table(
            header, cells, "per-dataset", flagged, text_columns={"run", TRAINING_RUN, "prompt set"}
        ),
        "notes": overlap_notes(comparison),
    }


def _comparability(comparison: Comparison) -> dict[str, Any]:
    names = list(COMPARABILITY)
    cells = []
    for row in comparison.rows:
        key = row.key()
        cells.append([row.run_id, str(row.step), row.key_id, *(short(key[name]) for name in names)])
    flagged = [row.run_id in comparison.differences for row in comparison.rows]
    text = set(names) | {"run", "key"}
    return _table(["run", "step", "key", *names], cells, "comparability", flagged, text)


def _diagnosis(section: dict[str, Any]) -> dict[str, Any]:
    """A diagnosis section with its per-slot and repair tables as the `table` macro takes them."""
    if section["problem"]:
        return section
    tables = {}
    for name, columns in (
        ("slots", report_diagnosis.SLOT_COLUMNS),
        ("repairs", report_diagnosis.REPAIR_COLUMNS),
    ):
        cells = section[name]
        named = {"candidate": "candidate acc.", "other": f"{section['against']} acc."}
        header = [named.get(column, column.replace("_", " ")) for column in columns]
        text = {"repair", "verdict"}
        tables[name] = _table(header, cells, None, [False] * len(cells), text) if cells else None
    return {**section, **tables}


def _table(
    header: list[str],
    cells: list[list[str]],
    table_id: str | None,
    flagged: list[bool],
    text_columns: set[str],
) -> dict[str, Any]:
    """A table as the template's `table` macro takes it: each cell with its classes."""

    def classes(column: str, value: str = "") -> str:
        names = ["text"] * (column in text_columns)
        return " ".join(names + ["flag"] * value.startswith("≠"))

    rows = [
        {
            "flagged": flag,
            "cells": [
                (str(value), classes(column, str(value)))
                for column, value in zip(header, row, strict=True)
            ],
        }
        for row, flag in zip(cells, flagged, strict=True)
    ]
    return {"id": table_id, "header": [(c, classes(c)) for c in header], "rows": rows}
