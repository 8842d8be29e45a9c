"""`fab report`: one self-contained static HTML file of a comparison.

Everything is inside the file (figures as inline SVG, styles inline, no script, no link to
anything): it can be mailed, archived or opened offline. Sections: τ vs step with 95 %
confidence intervals, the comparison table with its comparability flags, the per-prompt-set
table and whether consecutive steps' intervals overlap, per-position acceptance, DDTree τ by
budget, each run's provenance (whatever its results JSON records) and its decoded samples
when the results carry them. Runs that are not comparable with the latest one are shown,
flagged, and left out of the figures. `fab compare` rewrites it too.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dflash_eval.reading import COMPARABILITY
from dflash_eval.schema_metrics import Sample

from dflash_ops.evaluation import figures
from dflash_ops.evaluation.results import (
    TRAINING_RUN,
    Comparison,
    RunResult,
    dataset_rows,
    overlap_notes,
    table_rows,
)

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


def write(comparison: Comparison, path: Path, mixed: str | None = None) -> Path:
    """Render the comparison into `path` (atomically) and return it."""
    text = render(comparison, mixed)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)
    return path


def render(comparison: Comparison, mixed: str | None = None) -> str:
    """The whole HTML document."""
    charts = {name: figures.svg_text(f) for name, f in figures.build(comparison).items()}
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>DFlash drafter evaluation report</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>DFlash drafter evaluation report</h1>",
        f"<p>{len(comparison.rows)} run(s), steps "
        f"{_e(', '.join(str(r.step) for r in comparison.rows))}; written {created}.</p>",
    ]
    if mixed:
        parts.append(f'<p class="banner">{_e(mixed)}: flagged below, left out of the figures.</p>')
    parts += _section("τ vs step", _figure(charts, "tau_vs_step"))
    parts += _section("Comparison", _comparison_table(comparison))
    parts += _section("Per prompt set", _datasets(comparison, charts))
    parts += _section("Per-position acceptance", _figure(charts, "acceptance_per_position"))
    parts += _section("DDTree budgets", _figure(charts, "ddtree_budgets"))
    parts += _section("Comparability", _comparability(comparison))
    latest = comparison.rows[-1].run_id
    parts += _section(
        "Provenance",
        "".join(_provenance(row, open_=row.run_id == latest) for row in comparison.rows),
    )
    samples = "".join(_samples(row) for row in comparison.rows)
    parts += _section("Decoded samples", samples or "<p>No run carries decoded samples.</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _section(title: str, body: str) -> list[str]:
    anchor = title.lower().replace(" ", "-").replace("τ", "tau")
    return [f'<section id="{_e(anchor)}"><h2>{_e(title)}</h2>', body, "</section>"]


def _figure(charts: dict[str, str], name: str) -> str:
    if name not in charts:
        return "<p>Nothing to draw (no comparable run has these numbers).</p>"
    return f'<figure id="figure-{name}">{charts[name]}</figure>'


def _comparison_table(comparison: Comparison) -> str:
    header, cells = table_rows(comparison)
    flagged = [row.run_id in comparison.differences for row in comparison.rows]
    text_columns = {"run", TRAINING_RUN, "host", "comparable"}
    return _table(header, cells, "comparison", flagged, text_columns=text_columns)


def _datasets(comparison: Comparison, charts: dict[str, str]) -> str:
    header, cells = dataset_rows(comparison)
    if not cells:
        return "<p>No run carries confidence intervals (results from an older harness).</p>"
    settings = next(
        block["bootstrap"] for r in comparison.rows if (block := r.done.get("by_dataset"))
    )
    notes = overlap_notes(comparison)
    flagged = [row[0] in comparison.differences for row in cells]
    return "".join(
        [
            f"<p>95 % confidence intervals: {_e(settings['method'])} bootstrap over "
            f"{_e(settings['unit'])}s, {settings['resamples']} resamples, seed "
            f"{settings['seed']} (docs/results-schema.md).</p>",
            _table(
                header,
                cells,
                "per-dataset",
                flagged,
                text_columns={"run", TRAINING_RUN, "prompt set"},
            ),
            "<ul>" + "".join(f"<li>{_e(note)}</li>" for note in notes) + "</ul>" if notes else "",
            _figure(charts, "tau_by_dataset") if "tau_by_dataset" in charts else "",
        ]
    )


def _comparability(comparison: Comparison) -> str:
    names = list(COMPARABILITY)
    cells = []
    for row in comparison.rows:
        key = row.key()
        cells.append([row.run_id, str(row.step), *(_short(key[name]) for name in names)])
    flagged = [row.run_id in comparison.differences for row in comparison.rows]
    explanation = (
        "<p>What must match for two runs' numbers to be comparable; runs that differ from the "
        "latest run are flagged.</p>"
    )
    return explanation + _table(
        ["run", "step", *names], cells, "comparability", flagged, text_columns=set(names) | {"run"}
    )


def _provenance(row: RunResult, open_: bool) -> str:
    """Everything the run's results (and run.json) record about where its numbers come
    from; the latest run's is shown open."""
    run_facts = {f"run.{key}": value for key, value in row.run.items()}
    facts = dict(run_facts)
    for block in PROVENANCE_BLOCKS:
        facts.update(_flatten(row.results.get(block), block) if row.results else {})
    warnings = row.results["warnings"] if row.results else []
    rows = "".join(
        f'<tr><th class="text">{_e(key)}</th><td class="text"><code>{_e(_short(value, 96))}'
        "</code></td></tr>"
        for key, value in facts.items()
    )
    warned = "".join(f'<li class="flag">{_e(w)}</li>' for w in warnings)
    return (
        f"<details{' open' * open_}><summary>{_e(row.run_id)} ({_e(_step_of(row))})</summary>"
        f"<table>{rows}</table>{f'<ul>{warned}</ul>' if warned else ''}</details>"
    )


def _samples(row: RunResult) -> str:
    samples = row.results["samples"] if row.results else []
    if not samples:
        return ""
    shown = "".join(_sample(sample) for sample in samples)
    return (
        f"<details open><summary>{_e(row.run_id)} ({_e(_step_of(row))})</summary>{shown}</details>"
    )


def _step_of(row: RunResult) -> str:
    """'step N', or 'RUN step N' for a named training run's checkpoint."""
    return f"{row.training_run} step {row.step}" if row.training_run else f"step {row.step}"


def _sample(sample: Sample) -> str:
    """One decoded sample: text fields as text, lists of records as a table (so a field a
    newer harness adds is shown too)."""
    parts = []
    for key, value in sample.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            header = list(dict.fromkeys(k for v in value for k in v))
            cells = [[_short(v.get(k), 200) for k in header] for v in value]
            parts.append(_table(header, cells, None, [False] * len(cells), set(header)))
        elif "\n" in str(value) or len(str(value)) > 80:
            parts.append(f"<p><b>{_e(key)}</b></p><pre>{_e(_short(value, 4000))}</pre>")
        else:
            parts.append(f"<p><b>{_e(key)}</b> <code class='mono'>{_e(str(value))}</code></p>")
    return "<div class='sample'>" + "".join(parts) + "</div>"


def _table(
    header: list[str],
    cells: list[list[str]],
    table_id: str | None,
    flagged: list[bool],
    text_columns: set[str],
) -> str:
    def cell(tag: str, column: str, value: str) -> str:
        classes = ["text"] * (column in text_columns)
        if tag == "td" and value.startswith("≠"):
            classes.append("flag")
        attribute = f' class="{" ".join(classes)}"' if classes else ""
        return f"<{tag}{attribute}>{_e(value)}</{tag}>"

    head = "".join(cell("th", column, column) for column in header)
    body = "".join(
        ('<tr class="flagged">' if flag else "<tr>")
        + "".join(cell("td", column, value) for column, value in zip(header, row, strict=True))
        + "</tr>"
        for row, flag in zip(cells, flagged, strict=True)
    )
    identity = f' id="{table_id}"' if table_id else ""
    return (
        f'<div class="scroll"><table{identity}><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


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


def _e(text: str) -> str:
    return html.escape(text, quote=True)
