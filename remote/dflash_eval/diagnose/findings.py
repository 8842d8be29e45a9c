"""The findings of a diagnosis (diagnosis.py), ranked: most likely cause first.

Each finding: `area`, `title`, `evidence`, `check_next` and a `score` (0–100). Scores order
kinds of evidence, not probabilities:

  100  the candidate does not load (nothing else can be measured)
   95  non-finite weights
  80+  a probe raised τ beyond its interval (the checkpoint works better with that setting)
  72+  τ at its floor, and a probe lowered the loss of the target's tokens beyond its interval
   85  features outside the fidelity bounds; 82: bf16 features of a linear-attention
       target computed on CPU (within the bounds on the first prompt, drift grows with length)
  50+  configuration differences that change numbers; a trained block size the config
       contradicts
  70+  calibration: flat, under-confident slots (a soft-target loss)
   50  τ at its floor: probes on τ cannot show anything (they are judged on the loss)
  ≤60  symptoms: weights unlike the other's, over-confidence, a slope with context length,
       one prompt set, the slot where the gap opens

A cause that a probe demonstrates outranks a difference that only might matter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dflash_eval.target.features import judge

Finding = dict[str, Any]

# Config keys (as in config.json, dflash_config flattened) and how much a difference weighs.
CONFIG_WEIGHTS = {
    "target_layer_ids": 55,
    "mask_token_id": 65,
    "block_size": 60,
    "layer_types": 50,
    "sliding_window": 50,
    "use_sliding_window": 50,
    "is_causal": 50,
    "rope_theta": 50,
    "rope_scaling": 50,
    "partial_rotary_factor": 50,
    "rms_norm_eps": 30,
    "num_target_layers": 30,
    "input_embedding_scale": 50,
    "output_multiplier": 50,
    "final_logit_softcapping": 50,
}
CONFIG_DEFAULT_WEIGHT = 20
# Calibration: a slot is flat when its accuracy exceeds its mean top-1 probability by this.
UNDER_CONFIDENT = 0.15
OVER_CONFIDENT = 0.2
# A weight norm this many times the other's (or its inverse) is worth a look.
NORM_RATIO = 3.0
# A scale of an RMSNorm still this close to its initial ones has not been trained.
UNTRAINED_NORM = 1e-6
GAP_OPENS = 0.1  # per-slot conditional acceptance below the other's by this much
# A probe base τ below this: fewer than 5% of first slots accepted, τ cannot separate probes.
TAU_FLOOR = 1.05


def finding(score: float, area: str, title: str, evidence: str, check_next: str) -> Finding:
    return {
        "score": round(score, 1),
        "area": area,
        "title": title,
        "evidence": evidence,
        "check_next": check_next,
    }


def rank(diagnosis: dict[str, Any]) -> list[Finding]:
    """Every finding of the diagnosis, highest score first, numbered from 1."""
    if "load_error" in diagnosis["candidate"]:
        found = load_failure(diagnosis)
    else:
        found = [f for check in CHECKS for f in check(diagnosis)]
    found.sort(key=lambda f: -f["score"])
    return [{"rank": index, **f} for index, f in enumerate(found, start=1)]


def load_failure(diagnosis: dict[str, Any]) -> list[Finding]:
    candidate = diagnosis["candidate"]
    found = [
        finding(
            100,
            "loading",
            "the candidate does not load strictly",
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
                100,
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
    mine = diagnosis["candidate"]["drafter"]
    theirs = diagnosis["other"]["drafter"]
    ours, others = _flat(mine["config"]), _flat(theirs["config"])
    found = []
    for key in sorted(set(ours) | set(others)):
        if ours.get(key) == others.get(key):
            continue
        score = CONFIG_WEIGHTS.get(key, CONFIG_DEFAULT_WEIGHT)
        if key == "target_layer_ids" and len(ours.get(key) or ()) != len(others.get(key) or ()):
            score = 70
        found.append(
            finding(
                score,
                "configuration",
                f"{key} differs: {ours.get(key)} vs {others.get(key)}",
                f"candidate {key} = {ours.get(key)} ({mine['provenance'].get(key, 'config')}); "
                f"{diagnosis['against']} = {others.get(key)}",
                f"confirm the candidate was trained with {key} = {ours.get(key)} (training "
                "script or args); a config that misstates it changes every number",
            )
        )
    trained, used = mine.get("trained_block_size"), mine.get("eval_block_size")
    if trained and used and trained != used:
        found.append(
            finding(
                75,
                "configuration",
                f"trained with block size {trained}, evaluated with {used}",
                "the checkpoint's config or training args say block size "
                f"{trained}; the evaluation used {used}",
                f"evaluate with --block-size {trained}, or say why not",
            )
        )
    return found


def weight_health(diagnosis: dict[str, Any]) -> list[Finding]:
    mine = diagnosis["candidate"]["weights"]
    theirs = diagnosis["other"]["weights"]
    found = []
    broken = [name for name, row in mine.items() if not row["finite"]]
    if broken:
        found.append(
            finding(
                95,
                "weights",
                f"{len(broken)} parameters hold NaN or inf",
                f"non-finite: {', '.join(broken[:6])}",
                "the training run diverged or the checkpoint was corrupted: take an earlier step",
            )
        )
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
                60,
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
                35,
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


def calibration(diagnosis: dict[str, Any]) -> list[Finding]:
    mine = diagnosis["candidate"]["calibration"]
    theirs = diagnosis["other"]["calibration"]
    if not mine or not theirs:
        return []
    found = []
    gap = _weighted(mine, "accuracy") - _weighted(mine, "confidence")
    other_gap = _weighted(theirs, "accuracy") - _weighted(theirs, "confidence")
    entropy, other_entropy = _weighted(mine, "entropy"), _weighted(theirs, "entropy")
    table = ", ".join(
        f"slot {r['slot']}: p̂ {r['confidence']:.2f} vs right {r['accuracy']:.2f}" for r in mine[:4]
    )
    if gap > UNDER_CONFIDENT and gap - other_gap > UNDER_CONFIDENT / 2:
        found.append(
            finding(
                70 + min(20.0, 50 * (gap - other_gap)),
                "calibration",
                "flat, under-confident slots: a soft-target loss?",
                f"top-1 probability {_weighted(mine, 'confidence'):.2f} while the top-1 is right "
                f"{_weighted(mine, 'accuracy'):.2f} of the time ({table}); entropy "
                f"{entropy:.2f} vs {other_entropy:.2f} nats for {diagnosis['against']}",
                "check the training loss: hard cross-entropy on the target's tokens, not KL to "
                "a softened (temperature > 1) target distribution",
            )
        )
    elif -gap > OVER_CONFIDENT and other_gap - gap > OVER_CONFIDENT / 2:
        found.append(
            finding(
                40,
                "calibration",
                "over-confident slots: the drafter sees inputs unlike its training",
                f"top-1 probability {_weighted(mine, 'confidence'):.2f}, right "
                f"{_weighted(mine, 'accuracy'):.2f} ({table})",
                "check what it is fed: target layer ids, feature dtype, positions, block size",
            )
        )
    lost, other_lost = _weighted(mine, "rank_lost"), _weighted(theirs, "rank_lost")
    close = _weighted(mine, "rank_close")
    if close > lost and close > _weighted(theirs, "rank_close") + 0.1:
        found.append(
            finding(
                25,
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
                    20,
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
            45,
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
            30,
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
                85,
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
                82,
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
                25,
                "features",
                "feature fidelity was not measured",
                f"{record.get('dtype')} features: {fidelity.get('reason')}",
                "re-run with float32 features, or measure fidelity where there is memory",
            )
        ]
    return []


def _significant(difference: dict[str, Any]) -> bool:
    return bool(difference["mean"] - difference["half_width"] > 0)


def _at_floor(tau: float | None) -> bool:
    return tau is not None and tau < TAU_FLOOR


def probes(diagnosis: dict[str, Any]) -> list[Finding]:
    """A probe that raises τ beyond its interval; where the candidate's τ is at its floor
    (it accepts almost nothing, so no setting can raise τ measurably), one that lowers the
    loss of the target's tokens beyond its interval, ranked below any τ evidence."""
    found = []
    for probe in diagnosis["probes"]["settings"]:
        if _significant(probe["difference"]):
            found.append(_tau_probe(probe))
        elif _at_floor(probe["tau_base"]) and _significant(probe["loss_difference"]):
            found.append(_loss_probe(probe))
    return found


def _probe_cause(probe: dict[str, Any]) -> str:
    if probe["setting"] == "target_layer_ids":
        return "its config names the wrong target layers"
    return "it was trained with another block size"


def _tau_probe(probe: dict[str, Any]) -> Finding:
    difference = probe["difference"]
    base = probe["tau_base"] or 1.0
    return finding(
        80 + min(15.0, 15 * difference["mean"] / base),
        "probe",
        f"τ rises with {probe['label']}: {_probe_cause(probe)}?",
        f"τ {probe['tau_base']:.2f} → {probe['tau']:.2f} on {difference['prompts']} "
        f"prompts (+{difference['mean']:.2f} ± {difference['half_width']:.2f}, 95%; "
        f"slots 1..{probe['scored_slots']} scored); {probe['setting']} = "
        f"{probe['value']}; loss of the target's tokens {probe['loss_base']:.3f} → "
        f"{probe['loss']:.3f} nats",
        f"check the training run's {probe['setting']}; if it was {probe['value']}, fix the config",
    )


def _loss_probe(probe: dict[str, Any]) -> Finding:
    difference = probe["loss_difference"]
    return finding(
        72 + min(6.0, 6 * difference["mean"] / max(probe["loss_base"], 1e-9)),
        "probe",
        f"the target's tokens get likelier with {probe['label']}: {_probe_cause(probe)}?",
        f"τ is at its floor ({probe['tau_base']:.3f} → {probe['tau']:.3f}), so the probe is "
        f"judged on the loss of the target's tokens: {probe['loss_base']:.3f} → "
        f"{probe['loss']:.3f} nats on {difference['prompts']} prompts "
        f"(−{difference['mean']:.3f} ± {difference['half_width']:.3f}, 95%; slots "
        f"1..{probe['scored_slots']}); {probe['setting']} = {probe['value']}",
        f"check the training run's {probe['setting']}; if it was {probe['value']}, fix the "
        "config, and diagnose again: τ should leave its floor",
    )


def tau_floor(diagnosis: dict[str, Any]) -> list[Finding]:
    """Say plainly when τ cannot tell the probes apart: the candidate accepts ~nothing."""
    settings = diagnosis["probes"]["settings"]
    if not settings or not all(_at_floor(p["tau_base"]) for p in settings):
        return []
    best = max(settings, key=lambda p: p["loss_difference"]["mean"])
    change = best["loss_difference"]
    return [
        finding(
            50,
            "probe",
            f"τ is at its floor ({best['tau_base']:.3f}): probes on τ cannot show anything",
            f"the candidate as configured accepts almost no draft token on the "
            f"{change['prompts']} probe prompts, so every probe's τ difference is about 0; "
            "the probes are compared on the loss of the target's tokens instead (largest "
            f"fall: {best['label']}, {best['loss_base']:.3f} → {best['loss']:.3f} nats, "
            f"{-change['mean']:+.3f} ± {change['half_width']:.3f})",
            "check that the candidate loads the trained weights and is fed what it was "
            "trained on (mask token, target layers, feature dtype); a probe finding that "
            "lowers the loss beyond its interval names the setting",
        )
    ]


def no_gap(diagnosis: dict[str, Any]) -> list[Finding]:
    gap = diagnosis["gap"]
    if gap["mean"] - gap["half_width"] > 0:
        return []
    return [
        finding(
            5,
            "acceptance",
            "the candidate is not measurably worse",
            f"τ gap {gap['mean']:+.2f} ± {gap['half_width']:.2f} (95%) over {gap['prompts']} "
            "prompts",
            "more prompts narrow the interval",
        )
    ]


CHECKS: tuple[Callable[[dict[str, Any]], list[Finding]], ...] = (
    config_differences,
    weight_health,
    calibration,
    gap_opening,
    context_slope,
    prompt_sets,
    features,
    probes,
    tau_floor,
    no_gap,
)
