"""A diagnosis (diagnose/diagnosis.py) for people: terminal lines and a report section's data.

Torch-free: the workstation imports it to show a diagnosis it pulled.
"""

from __future__ import annotations

from typing import Any


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
    lines.append("Findings, most likely cause first:")
    for item in diagnosis["findings"]:
        lines.append(f"{item['rank']:>2}. [{item['area']}] {item['title']} (score {item['score']})")
        lines.append(f"    evidence: {item['evidence']}")
        lines.append(f"    check next: {item['check_next']}")
    return lines


def report_section(diagnosis: dict[str, Any]) -> dict[str, Any]:
    """What a report section shows: the findings, and per slot both drafters' acceptance
    and calibration, and the probes (rows of plain values, ready for a table)."""
    section: dict[str, Any] = {
        "against": diagnosis["against"],
        "candidate": diagnosis["candidate"]["checkpoint"],
        "findings": [
            {key: item[key] for key in ("rank", "area", "title", "evidence", "check_next")}
            for item in diagnosis["findings"]
        ],
        "slots": [],
        "probes": [],
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
    section["probes"] = [
        {
            "probe": probe["label"],
            "tau_base": probe["tau_base"],
            "tau": probe["tau"],
            "difference": probe["difference"]["mean"],
            "half_width": probe["difference"]["half_width"],
            # The loss of the target's tokens: it still moves where τ sits at its floor.
            "loss_base": probe.get("loss_base"),
            "loss": probe.get("loss"),
            "loss_fall": (probe.get("loss_difference") or {}).get("mean"),
            "loss_half_width": (probe.get("loss_difference") or {}).get("half_width"),
        }
        for probe in diagnosis["probes"]["settings"]
    ]
    return section
