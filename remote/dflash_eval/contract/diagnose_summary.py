"""A diagnosis (diagnose/diagnosis.py) for people: terminal lines and a report section's data.

Torch-free: the workstation imports it to show a diagnosis it pulled.
"""

from __future__ import annotations

from typing import Any

FINDINGS_HEADING = "Findings, measured causes first:"
# What a finding shows; a repair's also carries its measured effect.
FINDING_KEYS = (
    "rank", "area", "title", "evidence", "check_next", "setting", "delta_tau", "gap_closed",
    "repairs_tried",
)  # fmt: skip


def _tau(side: dict[str, Any]) -> str:
    value = (side.get("metrics") or {}).get("tau_macro")
    return "—" if value is None else f"{value:.2f}"


def summary_lines(diagnosis: dict[str, Any]) -> list[str]:
    """The comparison in one line, then each finding with its evidence and next step."""
    candidate, against = diagnosis["candidate"], diagnosis["against"]
    lines = [f"Diagnosis of {candidate['checkpoint']} (step {candidate.get('step')})"]
    if "other" in diagnosis:
        gap = diagnosis["gap"]
        lines.append(
            f"  τ {_tau(candidate)} vs {against} {_tau(diagnosis['other'])} "
            f"(gap {gap['mean']:+.2f} ± {gap['half_width']:.2f}, 95%, {gap['prompts']} prompts)"
        )
    repairs = diagnosis.get("repairs")
    if repairs:
        found = [r for r in repairs["tried"] if r["verdict"] == "finding"]
        shared = sum(bool((r.get("control") or {}).get("widens_gap")) for r in found)
        also = f" ({shared} of them the other's more)" if shared else ""
        lines.append(
            f"  {len(repairs['tried'])} repairs tried on {repairs['prompts']} prompts; beyond "
            f"noise: {len(found)}{also} (Holm, family-wise "
            f"{repairs['alpha']:.0%}; minimum Δτ {repairs['min_delta_tau']}, "
            f"{repairs['min_gap_share']:.0%} of the gap)"
        )
    lines.append(FINDINGS_HEADING)
    for item in diagnosis["findings"]:
        lines.append(f"{item['rank']:>2}. [{item['area']}] {item['title']}")
        lines.append(f"    evidence: {item['evidence']}")
        lines.append(f"    check next: {item['check_next']}")
    return lines


def report_section(diagnosis: dict[str, Any]) -> dict[str, Any]:
    """What a report section shows: the findings, and per slot both drafters' acceptance
    and calibration, and the repairs tried (rows of plain values, ready for a table)."""
    section: dict[str, Any] = {
        "against": diagnosis["against"],
        "candidate": diagnosis["candidate"]["checkpoint"],
        "findings": [
            {key: item[key] for key in FINDING_KEYS if key in item}
            for item in diagnosis["findings"]
        ],
        "slots": [],
        "repairs": [],
    }
    if "other" not in diagnosis:
        return section
    mine, theirs = diagnosis["candidate"], diagnosis["other"]
    calibration = {row["slot"]: row for row in mine["calibration"]}
    for ours, other in zip(
        mine["metrics"]["per_position"], theirs["metrics"]["per_position"], strict=False
    ):
        slot = ours["position"]
        row = calibration.get(slot, {})
        section["slots"].append(
            {
                "slot": slot,
                "candidate": ours["conditional"],
                "other": other["conditional"],
                "confidence": row.get("confidence"),
                "accuracy": row.get("accuracy"),
                "entropy": row.get("entropy"),
            }
        )
    section["repairs"] = [
        {
            "repair": repair["label"],
            "tau": repair["tau"],
            **_bounds("delta_tau", repair["delta_tau"]),
            **_bounds("gap_closed", repair["gap_closed"]),
            "verdict": repair["verdict"],
        }
        for repair in (diagnosis.get("repairs") or {}).get("tried", [])
    ]
    return section


def _bounds(name: str, interval: dict[str, Any] | None) -> dict[str, Any]:
    interval = interval or {}
    return {
        name: interval.get("value"),
        f"{name}_low": interval.get("low"),
        f"{name}_high": interval.get("high"),
    }
