"""The report's training-metrics section (templates/report_training.html.j2): each run's
τ beside its training run's own metrics at the same step, and the figure that puts τ and
one training metric on one step axis (figures, "tau_and_training")."""

from __future__ import annotations

from typing import Any

from dflash_ops.evaluation import training_metrics
from dflash_ops.evaluation.compare_rows import number
from dflash_ops.evaluation.results import Comparison, RunResult


def report_section(comparison: Comparison) -> dict[str, Any] | None:
    """The section's data (None: no run has training metrics)."""
    rows = [row for row in comparison.rows if row.training]
    if not rows:
        return None
    fields = training_metrics.fields_of(row.training for row in rows)
    header = ["run", "training run", "step", "τ macro", *fields]
    text = {"run", "training run"}
    table_rows = []
    for row in rows:
        cells = [
            row.run_id,
            row.training_run or "-",
            str(row.step),
            number(row.metrics["tau_macro"]),
            *(training_metrics.shown(row.training.get(field)) for field in fields),
        ]
        table_rows.append(
            {
                "flagged": row.run_id in comparison.differences,
                "cells": [
                    (c, "text" if h in text else "") for h, c in zip(header, cells, strict=True)
                ],
            }
        )
    table = {
        "id": "training-metrics-table",
        "header": [(h, "text" if h in text else "") for h in header],
        "rows": table_rows,
    }
    logs = sorted({_log_source(row) for row in rows} - {None})
    return {"table": table, "logs": logs}


def _log_source(row: RunResult) -> str | None:
    record = training_metrics.record_of(row.directory)
    return f"{record.log.path} ({record.log.format})" if record else None
