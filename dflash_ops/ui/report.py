"""`fab report`: one self-contained static HTML file of a comparison.

Everything is inside the file (figures as inline SVG, styles inline, no script, no link to
anything): it can be mailed, archived or opened offline. Sections: τ vs step with 95 %
confidence intervals, the comparison table with its comparability flags, the per-prompt-set
table and whether consecutive steps' intervals overlap, per-position acceptance, DDTree τ by
budget, each run's provenance (whatever its results JSON records) and its decoded samples
when the results carry them. Runs that are not comparable with the latest one are shown,
flagged, and left out of the figures. `fab compare` rewrites it too.

Every value read from results reaches the page through an autoescaping Jinja2 template
(templates/report.html.j2): this module builds plain data, the template the markup, and
nothing from a results file is ever marked safe (only the SVG matplotlib wrote is).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
from dflash_eval.reading import COMPARABILITY
from dflash_eval.schema_metrics import Sample
from markupsafe import Markup

from dflash_ops.core.files import write_atomic
from dflash_ops.evaluation import figures
from dflash_ops.evaluation.results import (
    TRAINING_RUN,
    Comparison,
    RunResult,
    dataset_rows,
    overlap_notes,
    table_rows,
)
from dflash_ops.ui import training_view

REPORT_NAME = "report.html"
# Results blocks shown as each run's provenance, in this order (bulky lists are summarised).
PROVENANCE_BLOCKS = (
    "checkpoint",
    "drafter",
    "target",
    "prompts",
    "completions",
    "harness",
    "libraries",
    "host",
    "timings_s",
    "throughput",
)
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
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
pre { white-space: pre-wrap; background: #f7f7f7; padding: 0.5em; }
.sample td, .mono { font-family: ui-monospace, monospace; white-space: pre; }
.sample { border-left: 3px solid #ddd; padding-left: 1em; margin: 1em 0; }
"""


def write(
    comparison: Comparison,
    path: Path,
    mixed: str | None = None,
    training_metric: str | None = None,
) -> Path:
    """Render the comparison into `path` (atomically) and return it."""
    return write_atomic(path, render(comparison, mixed, training_metric))


_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("dflash_ops.ui", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,  # a misspelt name fails the render, never prints ""
)


def render(
    comparison: Comparison, mixed: str | None = None, training_metric: str | None = None
) -> str:
    """The whole HTML document (`training_metric`: the one drawn beside τ, default the first
    logged)."""
    # matplotlib escapes the text it puts into its SVG: the one markup trusted as such.
    built = figures.build(comparison, training_metric)
    charts = {name: Markup(figures.svg_text(f)) for name, f in built.items()}
    latest = comparison.rows[-1].run_id
    context = {
        "style": Markup(STYLE),
        "charts": charts,
        "run_count": len(comparison.rows),
        "steps": ", ".join(str(r.step) for r in comparison.rows),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mixed": mixed,
        "comparison": _comparison_table(comparison),
        "datasets": _datasets(comparison),
        "comparability": _comparability(comparison),
        "provenance": [_provenance(row, row.run_id == latest) for row in comparison.rows],
        "samples": [samples for row in comparison.rows if (samples := _samples(row))],
        "training": training_view.report_section(comparison),
    }
    return _TEMPLATES.get_template("report.html.j2").render(context) + "\n"


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
        cells.append([row.run_id, str(row.step), *(_short(key[name]) for name in names)])
    flagged = [row.run_id in comparison.differences for row in comparison.rows]
    return _table(
        ["run", "step", *names], cells, "comparability", flagged, text_columns=set(names) | {"run"}
    )


def _provenance(row: RunResult, open_: bool) -> dict[str, Any]:
    """Everything the run's results (and run.json) record about where its numbers come
    from; the latest run's is shown open."""
    facts = {f"run.{key}": value for key, value in row.run.items()}
    for block in PROVENANCE_BLOCKS:
        facts.update(_flatten(row.results.get(block), block) if row.results else {})
    warnings = row.results["warnings"] if row.results else []
    return {
        "title": f"{row.run_id} ({_step_of(row)})",
        "open": open_,
        "facts": [(key, _short(value, 96)) for key, value in facts.items()],
        "warnings": [str(warning) for warning in warnings],
    }


def _samples(row: RunResult) -> dict[str, Any] | None:
    samples = row.results["samples"] if row.results else []
    if not samples:
        return None
    return {"title": f"{row.run_id} ({_step_of(row)})", "samples": [_sample(s) for s in samples]}


def _step_of(row: RunResult) -> str:
    """'step N', or 'RUN step N' for a named training run's checkpoint."""
    return f"{row.training_run} step {row.step}" if row.training_run else f"step {row.step}"


def _sample(sample: Sample) -> list[dict[str, Any]]:
    """One decoded sample: text fields as text, lists of records as a table (so a field a
    newer harness adds is shown too)."""
    parts: list[dict[str, Any]] = []
    for key, value in sample.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            keys = list(dict.fromkeys(k for v in value for k in v))
            header = [str(k) for k in keys]
            cells = [[_short(v.get(k), 200) for k in keys] for v in value]
            table = _table(header, cells, None, [False] * len(cells), set(header))
            parts.append({"kind": "table", "table": table})
        elif "\n" in str(value) or len(str(value)) > 80:
            parts.append({"kind": "block", "key": str(key), "text": _short(value, 4000)})
        else:
            parts.append({"kind": "line", "key": str(key), "text": str(value)})
    return parts


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


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    """Nested dicts as dotted keys; lists of records summarised by their length."""
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flatten(inner, f"{prefix}.{key}"))
        return flat
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        return {prefix: f"({len(value)} entries: see results.json)"}
    return {prefix: value}


def _short(value: Any, limit: int = 24) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
