"""The report's diagnosis section: each `fab diagnose` pulled for a step the report shows
(results/diagnose/<run-id>/diagnose.json), as dflash_eval.contract.diagnose_summary gives it: the
comparison line, the ranked findings, per slot both drafters' acceptance and calibration,
and the repairs tried. A diagnosis that cannot be read is named with the reason, never fatal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflash_eval.contract.diagnose_summary import FINDINGS_HEADING, report_section, summary_lines

from dflash_ops.core.errors import OpsError
from dflash_ops.evaluation.diagnose import DIAGNOSE_DIR, read_diagnosis
from dflash_ops.evaluation.results import Comparison

SLOT_COLUMNS = ("slot", "candidate", "other", "confidence", "accuracy", "entropy")
REPAIR_COLUMNS = (
    "repair",
    "tau",
    "delta_tau",
    "delta_tau_low",
    "delta_tau_high",
    "gap_closed",
    "gap_closed_low",
    "gap_closed_high",
    "verdict",
)


def pulled(results_root: Path) -> list[tuple[str, dict[str, Any] | str]]:
    """Every pulled diagnosis: (its run id, the diagnosis or why it cannot be read)."""
    found: list[tuple[str, dict[str, Any] | str]] = []
    for path in sorted((results_root / DIAGNOSE_DIR).glob("*/diagnose.json")):
        try:
            found.append((path.parent.name, read_diagnosis(path)))
        except OpsError as error:
            found.append((path.parent.name, str(error)))
    return found


def sections(
    comparison: Comparison, diagnoses: list[tuple[str, dict[str, Any] | str]]
) -> list[dict[str, Any]]:
    """The diagnoses of the report's runs' checkpoints (same training run and step)."""
    shown = {(row.training_run, row.step) for row in comparison.rows}
    out = []
    for run_id, diagnosis in diagnoses:
        if isinstance(diagnosis, str):
            out.append({"run_id": run_id, "problem": diagnosis})
            continue
        candidate = diagnosis.get("candidate")
        if not isinstance(candidate, dict):
            out.append({"run_id": run_id, "problem": "no candidate recorded"})
        elif (candidate.get("training_run"), candidate.get("step")) in shown:
            out.append(_section(run_id, diagnosis))
    return out


def _section(run_id: str, diagnosis: dict[str, Any]) -> dict[str, Any]:
    try:
        data = report_section(diagnosis)
        lines = summary_lines(diagnosis)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        return {"run_id": run_id, "problem": f"not a diagnosis this version reads ({error!r})"}
    return {
        "run_id": run_id,
        "problem": None,
        "heading": lines[: lines.index(FINDINGS_HEADING)],
        "against": str(data["against"]),
        "findings": data["findings"],
        "slots": [[_cell(row.get(c)) for c in SLOT_COLUMNS] for row in data["slots"]],
        "repairs": [[_cell(row.get(c)) for c in REPAIR_COLUMNS] for row in data["repairs"]],
    }


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
