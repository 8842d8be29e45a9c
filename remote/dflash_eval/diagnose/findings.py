"""The findings of a diagnosis (diagnosis.py), in order: what is measured to cause the gap
first, then what the evidence shows, never a hand-set score.

Each finding: `area`, `title`, `evidence` (with its numbers) and `check_next`. The order:

1. the candidate does not load (nothing else can be measured), non-finite weights;
2. repairs that close the gap (repair_stats.py: significant after Holm's correction over every
   repair tried, and at least the minimum effect), by the lower bound of the share of the gap
   each closes; such a finding carries `delta_tau` and `gap_closed` (value, low, high);
3. the training-side signatures, each with its number: features outside the fidelity bounds,
   flat, under-confident slots (a soft-target loss);
4. when repairs were tried and none closes the gap: that fact, with the largest Δτ measured
   (with no signature above it: the drafter is less trained, or differs in its training);
   then the rest of the evidence: over-confidence, near misses, untrained modules, where in
   the block and in the completion the gap opens, one prompt set;
5. configuration differences from the other drafter, each with what its repair measured;
6. no measurable gap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dflash_eval.diagnose.repair_stats import DETECTABLE_SD, FINDING
from dflash_eval.target.features import judge

Finding = dict[str, Any]

# Calibration: a slot is flat when its accuracy exceeds its mean top-1 probability by this.
UNDER_CONFIDENT = 0.15
OVER_CONFIDENT = 0.2
# A weight norm this many times the other's (or its inverse) is worth a look.
NORM_RATIO = 3.0
# A scale of an RMSNorm still this close to its initial ones has not been trained.
UNTRAINED_NORM = 1e-6
GAP_OPENS = 0.1  # per-slot conditional acceptance below the other's by this much


def finding(area: str, title: str, evidence: str, check_next: str, **measured: Any) -> Finding:
    return {
        "area": area,
        "title": title,
        "evidence": evidence,
        "check_next": check_next,
        **measured,
    }


def rank(diagnosis: dict[str, Any]) -> list[Finding]:
    """Every finding of the diagnosis in the order of the module docstring, numbered from 1."""
    if "load_error" in diagnosis["candidate"]:
        found = load_failure(diagnosis)
    else:
        found = [f for check in CHECKS for f in check(diagnosis)]
    return [{"rank": index, **f} for index, f in enumerate(found, start=1)]


def load_failure(diagnosis: dict[str, Any]) -> list[Finding]:
    candidate = diagnosis["candidate"]
    non_finite = candidate.get("load_error_kind") == "non-finite"
    found = [
        finding(
            "loading",
            "the candidate's weights hold NaN or inf"
            if non_finite
            else "the candidate does not load strictly",
            candidate["load_error"],
            "fix the checkpoint or its config before anything else: nothing was evaluated",
        )
    ]
    config = candidate.get("config") or {}
    ids = (config.get("dflash_config") or {}).get("target_layer_ids")
    fc = candidate["shapes"].get("fc.weight")
    hidden = diagnosis["hidden_size"]
    if ids and fc and len(fc) == 2 and fc[1] % hidden == 0 and fc[1] // hidden != len(ids):
        read = fc[1] // hidden
        found.insert(
            0,
            finding(
                "configuration",
                f"fc reads {read} target layers, the config names {len(ids)}",
                f"fc.weight is {fc} = [H, {read}·H] with H={hidden}; config target_layer_ids "
                f"{ids} ({len(ids)} layers)",
                f"find the {read} layer ids the drafter was trained on (training args or "
                "script) and put them in the config's dflash_config.target_layer_ids",
            ),
        )
    return found


def _flat(config: dict[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in config.items() if k != "dflash_config"}, **config["dflash_config"]}


def config_differences(diagnosis: dict[str, Any]) -> list[Finding]:
    """Each config value that differs from the other drafter's, with what its repair
    measured when one was tried (a difference alone is no cause)."""
    mine = diagnosis["candidate"]["drafter"]
    theirs = diagnosis["other"]["drafter"]
    ours, others = _flat(mine["config"]), _flat(theirs["config"])
    # The repair that applied the other drafter's value (or rule), where one was tried.
    tried = {
        r["setting"]: r
        for r in _repairs(diagnosis)
        if r["value"] == others.get(r["setting"]) or r.get("as_other")
    }
    found = []
    for key in sorted(set(ours) | set(others)):
        if ours.get(key) == others.get(key):
            continue
        repair = tried.get(key)
        measured = (
            f"; its repair: {_delta(repair)} ({repair['verdict']})"
            if repair is not None
            else "; not tried as a repair"
        )
        found.append(
            finding(
                "configuration",
                f"{key} differs: {ours.get(key)} vs {others.get(key)}",
                f"candidate {key} = {ours.get(key)} ({mine['provenance'].get(key, 'config')}); "
                f"{diagnosis['against']} = {others.get(key)}{measured}",
                f"confirm the candidate was trained with {key} = {ours.get(key)} (training "
                "script or args)",
            )
        )
    trained, used = mine.get("trained_block_size"), mine.get("eval_block_size")
    if trained and used and trained != used:
        found.append(
            finding(
                "configuration",
                f"trained with block size {trained}, evaluated with {used}",
                "the checkpoint's config or training args say block size "
                f"{trained}; the evaluation used {used}",
                f"evaluate with --block-size {trained}, or say why not",
            )
        )
    return found


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


def _repairs(diagnosis: dict[str, Any]) -> list[dict[str, Any]]:
    return (diagnosis.get("repairs") or {}).get("tried", [])


def _interval(value: dict[str, Any] | None, percent: bool = False) -> str:
    if value is None:
        return "n/a"
    scale, shape = (100, "{:.0f} %") if percent else (1, "{:+.2f}")
    shown = shape.format(value["value"] * scale)
    if value["low"] is None:
        return f"{shown} (interval unbounded)"
    return f"{shown} [{shape.format(value['low'] * scale)}, {shape.format(value['high'] * scale)}]"


def _delta(repair: dict[str, Any]) -> str:
    closed = repair["gap_closed"]
    share = f", {_interval(closed, percent=True)} of the gap" if closed else ""
    return f"τ {_interval(repair['delta_tau'])}{share}"


def repairs(diagnosis: dict[str, Any]) -> list[Finding]:
    """The repairs that close the gap, in the order judged (the lower bound of the share)."""
    summary = diagnosis.get("repairs") or {}
    tried = _repairs(diagnosis)
    found = []
    for repair in (r for r in tried if r["verdict"] == FINDING):
        found.append(
            finding(
                "repair",
                f"{repair['label']}: τ {summary['tau_candidate']:.2f} → {repair['tau']:.2f}",
                f"{_delta(repair)} on {summary['prompts']} prompts (95 % intervals, paired; "
                f"significant after Holm's correction over {len(tried)} repairs, p = "
                f"{repair['p_value']:.2g}); {repair['setting']} = {repair['value']}",
                f"check the training run's {repair['setting']}; if it was {repair['value']}, "
                "fix the config",
                setting=repair["setting"],
                delta_tau=repair["delta_tau"],
                gap_closed=repair["gap_closed"],
                repairs_tried=len(tried),
            )
        )
    combined = summary.get("combined")
    if combined and len(combined["steps"]) > 1:
        first, then = combined["steps"]
        closed = combined["gap_closed"]
        share = f", {_interval(closed, percent=True)} of the gap closed" if closed else ""
        found.insert(
            1,
            finding(
                "repair",
                f"with {first} (then {then}): τ {summary['tau_candidate']:.2f} → "
                f"{combined['tau']:.2f}{share}",
                f"after {first}, {len(combined['then_tried'])} repairs were tried again on the "
                f"repaired drafter and {then} still closed part of what was left",
                "check both settings against the training run",
                gap_closed=closed,
                repairs_tried=len(tried) + len(combined["then_tried"]),
            ),
        )
    return found


def nothing_repairs(diagnosis: dict[str, Any]) -> list[Finding]:
    """Repairs were tried, the candidate is behind, and no setting change closes the gap."""
    tried, gap = _repairs(diagnosis), diagnosis["gap"]
    if not tried or any(r["verdict"] == FINDING for r in tried) or not _behind(gap):
        return []
    best = max(tried, key=lambda r: r["delta_tau"]["value"])
    evidence = (
        f"τ gap {gap['mean']:+.2f} ± {gap['half_width']:.2f} (95 %) over {gap['prompts']} "
        f"prompts; the largest repair, {best['label']}, measured {_delta(best)}: none "
        "is beyond noise and the minimum effect"
    )
    check_next = (
        "the gap is in the weights: an earlier step of a run that is still improving "
        "(compare τ across its steps), or a training-side difference (loss, data, "
        "features); the evidence below says which"
    )
    summary = diagnosis["repairs"]
    detectable = summary.get("detectable_sd")
    if detectable is not None and detectable > DETECTABLE_SD:
        evidence += (
            f"; but with {summary['prompts']} prompts and {len(tried)} repairs only a change "
            f"of at least {detectable:.1f} standard deviations of its per-prompt effect could "
            "count: too few prompts to rule a repair out"
        )
        check_next = (
            f"first run again with at least {summary['prompts_needed']} prompts "
            f"(--num-prompts); then, if still nothing: {check_next}"
        )
    title = f"no setting change closes the gap ({len(tried)} repairs tried)"
    return [finding("repair", title, evidence, check_next)]


def _behind(gap: dict[str, Any]) -> bool:
    return bool(gap["mean"] - gap["half_width"] > 0)


def no_gap(diagnosis: dict[str, Any]) -> list[Finding]:
    gap = diagnosis["gap"]
    if _behind(gap):
        return []
    return [
        finding(
            "acceptance",
            "the candidate is not measurably worse",
            f"τ gap {gap['mean']:+.2f} ± {gap['half_width']:.2f} (95%) over {gap['prompts']} "
            "prompts",
            "more prompts narrow the interval",
        )
    ]


CHECKS: tuple[Callable[[dict[str, Any]], list[Finding]], ...] = (
    non_finite,
    repairs,
    features,
    flat_slots,
    nothing_repairs,
    calibration,
    weight_health,
    gap_opening,
    context_slope,
    prompt_sets,
    config_differences,
    no_gap,
)
