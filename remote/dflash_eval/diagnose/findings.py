"""The findings of a diagnosis (diagnosis.py), in order: what is measured to cause the gap
first, then what the evidence shows, never a hand-set score.

Each finding: `area`, `title`, `evidence` (with its numbers) and `check_next`. The order:

1. the candidate does not load (nothing else can be measured), non-finite weights;
2. repairs that close the gap (repair_stats.py: significant after Holm's correction over every
   repair tried, and at least the minimum effect), by the lower bound of the share of the gap
   each closes; such a finding carries `delta_tau` and `gap_closed` (value, low, high);
3. the training-side signatures, each with its number: features outside the fidelity bounds,
   flat, under-confident slots (a soft-target loss), the other drafter a later step of the
   candidate's own run (less trained) or an earlier one (the run got worse), a gain from the
   target features (τ with them minus τ without) smaller than the other's that accounts for
   most of the gap (noisy training features);
4. when repairs were tried and none closes the gap: that fact, with the largest Δτ measured
   (with no signature above it: the drafter is less trained, or differs in its training);
   then the rest of the evidence: a smaller gain from the features that accounts for part of
   the gap, over-confidence, near misses, untrained modules, where in the block and in the
   completion the gap opens, one prompt set;
5. configuration differences from the other drafter, each with what its repair measured;
6. no measurable gap.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from dflash_eval.diagnose.finding import Finding, finding
from dflash_eval.diagnose.repair_stats import DETECTABLE_SD, FINDING, MIN_DELTA
from dflash_eval.diagnose.signatures import (
    calibration,
    context_slope,
    features,
    flat_slots,
    gap_opening,
    non_finite,
    prompt_sets,
    weight_health,
)

# A gain from the features that accounts for at least this share of the gap (its lower bound)
# comes before "no setting change closes the gap": the gap is mostly in what they give.
MOST_OF_THE_GAP = 0.5
STEP = re.compile(r"(?:step|checkpoint)[_-]?\d+")  # a step's directory, as drafter/checkpoint.py


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


def _fix(repair: dict[str, Any]) -> str:
    """What to do about a repair that closes the gap."""
    if repair["setting"] == "features_dtype":
        return (
            f"evaluate with {repair['value']} features: omit --target-dtype (or free memory "
            "for it), or compute them on a features host (fab extract-features) as training did"
        )
    setting, value = repair["setting"], repair["value"]
    return f"check the training run's {setting}; if it was {value}, fix the config"


def repairs(diagnosis: dict[str, Any]) -> list[Finding]:
    """The repairs that close the gap, in the order judged (the lower bound of the share)."""
    summary = diagnosis.get("repairs") or {}
    tried = _repairs(diagnosis)
    found = []
    for repair in (r for r in tried if _repairs_candidate(r)):
        found.append(
            finding(
                "repair",
                f"{repair['label']}: τ {summary['tau_candidate']:.2f} → {repair['tau']:.2f}",
                _repair_evidence(diagnosis, repair, len(tried)),
                _fix(repair),
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


def _repair_evidence(diagnosis: dict[str, Any], repair: dict[str, Any], tried: int) -> str:
    summary = diagnosis["repairs"]
    evidence = (
        f"{_delta(repair)} on {summary['prompts']} prompts (95 % intervals, paired; "
        f"significant after Holm's correction over {tried} repairs, p = "
        f"{repair['p_value']:.2g}); {repair['setting']} = {repair['value']}"
    )
    control = repair.get("control")
    if control:
        evidence += (
            f"; the same change gives {diagnosis['against']} τ "
            f"{_interval(control['other_delta_tau'])}, the candidate τ "
            f"{_interval(control['beyond_other'])} beyond that"
        )
    return evidence


def _widens_gap(repair: dict[str, Any]) -> bool:
    """A finding whose change raises the other drafter's τ more (its control says so)."""
    control = repair.get("control")
    return repair["verdict"] == FINDING and control is not None and control["widens_gap"]


def _repairs_candidate(repair: dict[str, Any]) -> bool:
    """A finding that repairs the candidate alone (or whose change the other cannot take)."""
    return repair["verdict"] == FINDING and not _widens_gap(repair)


def widening_settings(diagnosis: dict[str, Any]) -> list[Finding]:
    """Changes that raise the candidate's τ but the other drafter's more: made to both they
    widen the gap, so they suit the target and prompts and repair nothing of the
    candidate's: evidence, not a cause."""
    summary, tried = diagnosis.get("repairs") or {}, _repairs(diagnosis)
    return [
        finding(
            "setting",
            f"{repair['label']} raises {diagnosis['against']}'s τ more than the "
            f"candidate's ({summary['tau_candidate']:.2f} → {repair['tau']:.2f}): not a repair",
            _repair_evidence(diagnosis, repair, len(tried)),
            "made to both drafters it widens the gap: it suits the target and prompts and "
            "repairs nothing of the candidate's; look for the gap elsewhere",
            setting=repair["setting"],
            delta_tau=repair["delta_tau"],
        )
        for repair in tried
        if _widens_gap(repair)
    ]


def same_run(diagnosis: dict[str, Any]) -> list[Finding]:
    """The other drafter is another step of the candidate's own training run and no setting
    change repairs the candidate alone (none closes the gap, or the other gains even
    it more): the gap is what training did between the two steps (on, when the other is later: an
    earlier step of a run still improving; back, when it is earlier)."""
    mine, theirs, gap = diagnosis["candidate"], diagnosis["other"], diagnosis["gap"]
    if any(_repairs_candidate(r) for r in _repairs(diagnosis)) or not _behind(gap):
        return []
    steps = mine.get("step"), theirs.get("step")
    run = _run_directory(mine["checkpoint"])
    if None in steps or steps[0] == steps[1] or run is None:
        return []
    if run != _run_directory(theirs["checkpoint"]):
        return []
    mine_step, their_step = steps
    measured = (
        f"{diagnosis['against']} is step {their_step} of the candidate's own training run "
        f"({run}); τ gap {gap['mean']:+.2f} ± {gap['half_width']:.2f} (95 %) over "
        f"{gap['prompts']} prompts, and no setting change repairs the candidate alone"
    )
    if their_step > mine_step:
        return [
            finding(
                "training",
                f"less trained: step {mine_step} is an earlier step of a run that is still "
                f"improving (step {their_step} is ahead by τ {gap['mean']:+.2f})",
                measured,
                "train on, or evaluate a later step; fab compare shows τ across the run's steps",
            )
        ]
    return [
        finding(
            "training",
            f"the run got worse: step {mine_step} is behind its own earlier step {their_step} "
            f"by τ {gap['mean']:+.2f}",
            measured,
            f"read the training metrics between steps {their_step} and {mine_step} (loss "
            "spikes, the learning-rate schedule, the data); until then, use the earlier step",
        )
    ]


def _run_directory(checkpoint: str) -> PurePath | None:
    """The directory that holds a checkpoint's step directory (`RUN/step_N/checkpoint.pt`,
    `RUN/checkpoint-N/`): one training run's steps share it, as the trainer and the staging
    lay them out. None when no part of the path names a step."""
    path = PurePath(checkpoint)
    return next((part.parent for part in (path, *path.parents) if STEP.fullmatch(part.name)), None)


def _features_read_less(diagnosis: dict[str, Any], most: bool) -> list[Finding]:
    """The candidate gains less τ from the target features than the other drafter does (a
    drafter trained on noisy features learnt to read them little), measured as the share of
    the gap that gain accounts for; `most`: only when that share is at least MOST_OF_THE_GAP
    (it then comes before "no setting change"), else only when it is less. Not for a
    candidate at its floor (τ within MIN_DELTA of 1): the share would only restate the gap."""
    summary = diagnosis.get("repairs") or {}
    measured = summary.get("features")
    if not measured or measured["verdict"] != FINDING or measured["gap_closed"] is None:
        return []
    if summary["tau_candidate"] - 1.0 < MIN_DELTA:  # at its floor it gains nothing from anything
        return []
    low = measured["gap_closed"]["low"]
    if most != (low is not None and low >= MOST_OF_THE_GAP):
        return []
    mine = diagnosis["candidate"]["feature_reliance"]
    theirs = diagnosis["other"]["feature_reliance"]
    against, tried = diagnosis["against"], len(_repairs(diagnosis)) + 1
    blind = measured["tau_blind"]
    return [
        finding(
            "features",
            f"the candidate gains less from the target features than {against}: "
            f"{_interval(measured['gap_closed'], percent=True)} of the gap",
            f"zeroing the target features costs the candidate τ {mine['mean']:+.2f} ± "
            f"{mine['half_width']:.2f} and {against} τ {theirs['mean']:+.2f} ± "
            f"{theirs['half_width']:.2f} (without them: τ {blind['candidate']:.2f} and "
            f"{blind['other']:.2f}); the candidate with {against}'s gain from them: "
            f"{_delta(measured)} on {measured['prompts']} prompts (95 % intervals, paired; "
            f"significant after Holm's correction over {tried} measurements, p = "
            f"{measured['p_value']:.2g})",
            "check the training run's features: noise or dropout on the target's hidden "
            "states, features from other layers or positions; an earlier step that has not "
            "yet learnt to read them shows the same (compare τ across its steps)",
            delta_tau=measured["delta_tau"],
            gap_closed=measured["gap_closed"],
            repairs_tried=tried,
        )
    ]


def features_read_less(diagnosis: dict[str, Any]) -> list[Finding]:
    return _features_read_less(diagnosis, most=True)


def features_read_less_in_part(diagnosis: dict[str, Any]) -> list[Finding]:
    return _features_read_less(diagnosis, most=False)


def nothing_repairs(diagnosis: dict[str, Any]) -> list[Finding]:
    """Repairs were tried, the candidate is behind, and no setting change closes the gap."""
    tried, gap = _repairs(diagnosis), diagnosis["gap"]
    if not tried or any(_repairs_candidate(r) for r in tried) or not _behind(gap):
        return []
    widening = [r for r in tried if _widens_gap(r)]
    best = max((r for r in tried if not _widens_gap(r)), key=_gain, default=None)
    evidence = (
        f"τ gap {gap['mean']:+.2f} ± {gap['half_width']:.2f} (95 %) over {gap['prompts']} prompts"
    )
    if best is not None:
        evidence += (
            f"; the largest repair, {best['label']}, measured {_delta(best)}: none is beyond "
            "noise and the minimum effect"
        )
    if widening:
        evidence += (
            f"; changes that widen the gap when made to both drafters: {len(widening)} (below: "
            f"they raise {diagnosis['against']}'s τ more than the candidate's)"
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
    for skipped in summary.get("not_tried", []):
        evidence += f"; not tried: {skipped['label']} ({skipped['why']})"
    title = f"no setting change closes the gap ({len(tried)} repairs tried)"
    return [finding("repair", title, evidence, check_next)]


def _gain(repair: dict[str, Any]) -> float:
    return repair["delta_tau"]["value"]


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
    same_run,
    features,
    flat_slots,
    features_read_less,
    nothing_repairs,
    widening_settings,
    features_read_less_in_part,
    calibration,
    weight_health,
    gap_opening,
    context_slope,
    prompt_sets,
    config_differences,
    no_gap,
)
