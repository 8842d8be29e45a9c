"""The training-side signatures a diagnosis reads in what it measured, each with its number:
non-finite or untrained weights and norms far from the other drafter's, flat (under-confident)
or over-confident slots, features outside the fidelity bounds, where in the block and in the
completion the gap opens, and a prompt set that alone carries the gap. findings.py puts them
in order among the measured repairs.
"""

from __future__ import annotations

from typing import Any

from dflash_eval.diagnose.finding import Finding, finding
from dflash_eval.target.features import judge

# Calibration: a slot is flat when its accuracy exceeds its mean top-1 probability by this.
UNDER_CONFIDENT = 0.15
OVER_CONFIDENT = 0.2
# A weight norm this many times the other's (or its inverse) is worth a look.
NORM_RATIO = 3.0
# A scale of an RMSNorm still this close to its initial ones has not been trained.
UNTRAINED_NORM = 1e-6
GAP_OPENS = 0.1  # per-slot conditional acceptance below the other's by this much


def non_finite(diagnosis: dict[str, Any]) -> list[Finding]:
    broken = [name for name, row in diagnosis["candidate"]["weights"].items() if not row["finite"]]
    if not broken:
        return []
    return [
        finding(
            "weights",
            f"{len(broken)} parameters hold NaN or inf",
            f"non-finite: {', '.join(broken[:6])}",
            "the training run diverged or the checkpoint was corrupted: take an earlier step",
        )
    ]


def weight_health(diagnosis: dict[str, Any]) -> list[Finding]:
    mine = diagnosis["candidate"]["weights"]
    theirs = diagnosis["other"]["weights"]
    found = []
    untrained = [
        name
        for name, row in mine.items()
        if row.get("from_init") is not None
        and row["from_init"] <= UNTRAINED_NORM
        and ((theirs.get(name) or {}).get("from_init") or 0.0) > UNTRAINED_NORM
    ]
    if untrained:
        found.append(
            finding(
                "weights",
                f"{len(untrained)} norm scales still at their initial ones",
                f"untouched since init: {', '.join(untrained[:6])} (trained in "
                f"{diagnosis['against']})",
                "check that these modules receive gradients (frozen, or not in the optimizer)",
            )
        )
    ratios = []
    for name, row in mine.items():
        other = theirs.get(name)
        if other and row["norm"] and other["norm"] and row["shape"] == other["shape"]:
            ratio = row["norm"] / other["norm"]
            if ratio > NORM_RATIO or ratio < 1 / NORM_RATIO:
                ratios.append(f"{name} ×{ratio:.2g}")
    if ratios:
        found.append(
            finding(
                "weights",
                f"{len(ratios)} parameters with norms far from the other drafter's",
                "norm vs the other's: " + ", ".join(ratios[:6]),
                "compare the training recipes (learning rate, weight decay, init, steps)",
            )
        )
    return found


def _weighted(rows: list[dict[str, Any]], key: str) -> float:
    total = sum(r["rounds"] for r in rows)
    return sum(r[key] * r["rounds"] for r in rows) / total if total else 0.0


def _calibration_gaps(diagnosis: dict[str, Any]) -> tuple[float, float] | None:
    """How far the top-1 is right more often than its probability says, both drafters."""
    mine, theirs = diagnosis["candidate"]["calibration"], diagnosis["other"]["calibration"]
    if not mine or not theirs:
        return None
    gap = _weighted(mine, "accuracy") - _weighted(mine, "confidence")
    return gap, _weighted(theirs, "accuracy") - _weighted(theirs, "confidence")


def _slot_table(rows: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"slot {r['slot']}: p̂ {r['confidence']:.2f} vs right {r['accuracy']:.2f}" for r in rows[:4]
    )


def flat_slots(diagnosis: dict[str, Any]) -> list[Finding]:
    """The soft-target signature: slots far less confident than they are right."""
    gaps = _calibration_gaps(diagnosis)
    if gaps is None or not (gaps[0] > UNDER_CONFIDENT and gaps[0] - gaps[1] > UNDER_CONFIDENT / 2):
        return []
    mine, theirs = diagnosis["candidate"]["calibration"], diagnosis["other"]["calibration"]
    return [
        finding(
            "calibration",
            "flat, under-confident slots: a soft-target loss?",
            f"top-1 probability {_weighted(mine, 'confidence'):.2f} while the top-1 is right "
            f"{_weighted(mine, 'accuracy'):.2f} of the time ({_slot_table(mine)}); entropy "
            f"{_weighted(mine, 'entropy'):.2f} vs {_weighted(theirs, 'entropy'):.2f} nats for "
            f"{diagnosis['against']}",
            "check the training loss: hard cross-entropy on the target's tokens, not KL to "
            "a softened (temperature > 1) target distribution",
        )
    ]


def calibration(diagnosis: dict[str, Any]) -> list[Finding]:
    """Calibration symptoms beyond the soft-target signature: over-confidence, near misses."""
    gaps = _calibration_gaps(diagnosis)
    if gaps is None:
        return []
    mine, theirs = diagnosis["candidate"]["calibration"], diagnosis["other"]["calibration"]
    found = []
    if -gaps[0] > OVER_CONFIDENT and gaps[1] - gaps[0] > OVER_CONFIDENT / 2:
        found.append(
            finding(
                "calibration",
                "over-confident slots: the drafter sees inputs unlike its training",
                f"top-1 probability {_weighted(mine, 'confidence'):.2f}, right "
                f"{_weighted(mine, 'accuracy'):.2f} ({_slot_table(mine)})",
                "check what it is fed: target layer ids, feature dtype, positions, block size",
            )
        )
    lost, other_lost = _weighted(mine, "rank_lost"), _weighted(theirs, "rank_lost")
    close = _weighted(mine, "rank_close")
    if close > lost and close > _weighted(theirs, "rank_close") + 0.1:
        found.append(
            finding(
                "calibration",
                "the target's token is close but not first",
                f"target token at rank 1..9: {close:.0%} of slots; lost (rank ≥ 10): {lost:.0%} "
                f"(other: {other_lost:.0%})",
                "DDTree recovers near misses; compare the DDTree τ with the vanilla τ",
            )
        )
    return found


def gap_opening(diagnosis: dict[str, Any]) -> list[Finding]:
    mine = diagnosis["candidate"]["metrics"]["per_position"]
    theirs = diagnosis["other"]["metrics"]["per_position"]
    for ours, other in zip(mine, theirs, strict=False):
        a, b = ours["conditional"], other["conditional"]
        if a is not None and b is not None and b - a > GAP_OPENS:
            return [
                finding(
                    "acceptance",
                    f"the gap opens at slot {ours['position']}",
                    f"P(slot {ours['position']} right | earlier right): {a:.2f} vs {b:.2f}; "
                    "per slot: "
                    + ", ".join(
                        f"{x['conditional']:.2f}/{y['conditional']:.2f}"
                        for x, y in zip(mine, theirs, strict=False)
                        if x["conditional"] is not None and y["conditional"] is not None
                    ),
                    "slot 1 behind: the features or the anchor; later slots: block size, "
                    "position or mask handling",
                )
            ]
    return []


def context_slope(diagnosis: dict[str, Any]) -> list[Finding]:
    mine = [b for b in diagnosis["candidate"]["by_context_length"] if b["tau"] is not None]
    theirs = [b for b in diagnosis["other"]["by_context_length"] if b["tau"] is not None]
    if len(mine) < 2 or len(theirs) < 2:
        return []
    # τ late in the completion relative to τ early on: a window or position problem makes
    # the candidate's ratio fall behind the other's.
    ratio = mine[-1]["tau"] / mine[0]["tau"]
    other_ratio = theirs[-1]["tau"] / theirs[0]["tau"]
    if ratio >= 0.75 * other_ratio:
        return []
    return [
        finding(
            "context length",
            "the candidate falls behind later in the completion",
            f"candidate τ {mine[0]['tau']:.2f} → {mine[-1]['tau']:.2f} from the first to the "
            f"last span of the completion (×{ratio:.2f}); {diagnosis['against']} "
            f"{theirs[0]['tau']:.2f} → {theirs[-1]['tau']:.2f} (×{other_ratio:.2f})",
            "check the sliding window, RoPE (theta, scaling) and the positions used in training",
        )
    ]


def prompt_sets(diagnosis: dict[str, Any]) -> list[Finding]:
    mine, theirs = diagnosis["candidate"]["by_prompt_set"], diagnosis["other"]["by_prompt_set"]
    gaps = {name: theirs[name] - mine[name] for name in mine if name in theirs}
    if len(gaps) < 2:
        return []
    worst = max(gaps, key=lambda name: gaps[name])
    rest = [g for name, g in gaps.items() if name != worst]
    if gaps[worst] <= 2 * max(max(rest), 0.1):
        return []
    return [
        finding(
            "prompt sets",
            f"the gap is mostly on {worst}",
            "τ gap by set: " + ", ".join(f"{n} {g:+.2f}" for n, g in sorted(gaps.items())),
            f"check the training data's coverage of {worst}-like prompts",
        )
    ]


def features(diagnosis: dict[str, Any]) -> list[Finding]:
    record = diagnosis.get("features") or {}
    fidelity = record.get("fidelity") or {}
    lines = judge(fidelity.get("layers") or {})
    if lines:
        return [
            finding(
                "features",
                "the target features are outside the fidelity bounds",
                f"{record.get('dtype')} on {record.get('device')}: " + "; ".join(lines[:3]),
                "compute features in float32 on CPU, or on a GPU with the training kernels",
            )
        ]
    kernel = (record.get("kernel") or {}).get("linear_attention")
    if fidelity.get("status") == "measured" and kernel == "torch fallback":
        worst = max(
            (row["relative_error"] for row in (fidelity.get("layers") or {}).values()),
            default=0.0,
        )
        return [
            finding(
                "features",
                f"{record.get('dtype')} features of a linear-attention target on CPU",
                f"the target's linear-attention layers ran in {record.get('dtype')} through the "
                f"torch fallback on {record.get('device')} (largest relative error against "
                f"float32 on the first prompt: {worst:.3g}); the drafter was trained on "
                "features from the GPU kernels",
                "compute features in float32 on CPU (--target-dtype float32) or on a features "
                "host with the training kernels, and diagnose again",
            )
        ]
    if fidelity.get("status") == "skipped":
        return [
            finding(
                "features",
                "feature fidelity was not measured",
                f"{record.get('dtype')} features: {fidelity.get('reason')}",
                "re-run with float32 features, or measure fidelity where there is memory",
            )
        ]
    return []
