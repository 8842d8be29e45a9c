"""One finding of a diagnosis, as diagnose.json holds it: a typed record, JSON as it stands.

Every finding has an area, a title, its evidence (with its numbers) and what to check next;
`rank` is given when the findings are put in order (findings.rank). A measured repair also
carries the setting it changed, Δτ and the share of the gap it closes, with their intervals,
and how many repairs were tried (the family Holm's correction ran over).
"""

from __future__ import annotations

from typing import TypedDict


class IntervalRecord(TypedDict):
    value: float
    low: float | None  # None: not bounded at 95 % (too few prompts, or no gap)
    high: float | None


class Finding(TypedDict, total=False):
    rank: int
    area: str  # "loading", "repair", "features", "calibration", "configuration", …
    title: str
    evidence: str
    check_next: str
    setting: str
    delta_tau: IntervalRecord
    gap_closed: IntervalRecord | None
    repairs_tried: int


def finding(
    area: str,
    title: str,
    evidence: str,
    check_next: str,
    *,
    setting: str | None = None,
    delta_tau: IntervalRecord | None = None,
    gap_closed: IntervalRecord | None = None,
    repairs_tried: int | None = None,
) -> Finding:
    """A finding; the measured fields only where they were measured."""
    made = Finding(area=area, title=title, evidence=evidence, check_next=check_next)
    if setting is not None:
        made["setting"] = setting
    if delta_tau is not None:
        made["delta_tau"] = delta_tau
    if repairs_tried is not None:  # a repair's finding: its share of the gap, even unknown
        made["gap_closed"] = gap_closed
        made["repairs_tried"] = repairs_tried
    return made
