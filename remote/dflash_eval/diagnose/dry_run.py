"""`python -m dflash_eval plan --diagnose …`: what a `diagnose` with the same flags would run
(the repairs it would try, on how many prompts) and how long it would take, from eval's plan
of the same flags: nothing is loaded beyond what that plan reads, nothing is written.

A diagnosis is an eval of both drafters (the plan's `drafter` and `reference_drafter`
phases), one more walk of each with its features zeroed, and one vanilla walk of the
candidate per repair (the float32-features repair also computes the target's hidden states
in float32, as eval's plan in float32 estimates them). A repair's walk costs the
candidate's walk scaled by its block size (a larger block drafts and scores all its slots).
When the best repair is a finding, the repairs of the other kinds are tried again on top of
it, and each finding is controlled by the same change made to the other drafter (one walk
of it): that second round is the `up_to` figure, not the expected one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dflash_eval.diagnose.repairs import dtype_settings, repair_settings, special_tokens
from dflash_eval.plan.dry_run import HostFacts, make_plan
from dflash_eval.run.options import EvalOptions
from dflash_eval.target.config import TargetConfig, read_target_config
from dflash_eval.target.dtype import float32_shortfall
from dflash_eval.target.files import load_tokenizer

UNKNOWN_UNTIL_STAGED = "unknown until both drafters are staged"


def make_diagnose_plan(options: EvalOptions, facts: HostFacts | None = None) -> dict[str, Any]:
    """eval's plan of these options, with a `diagnose` part: the repairs and their time."""
    other = options.reference_drafter
    staged = other is not None and Path(other).exists()
    # An other step not staged yet is planned as absent (the eval plan would call it broken).
    plan = make_plan(
        options if staged else dataclasses.replace(options, reference_drafter=None), facts
    )
    plan["diagnose"] = _repairs_part(options, plan, staged, facts)
    return plan


def _repairs_part(
    options: EvalOptions, plan: dict[str, Any], staged: bool, facts: HostFacts | None
) -> dict[str, Any]:
    candidate, other = plan["drafter"], plan["reference_drafter"]
    prompts = plan["prompts"]["count"]
    if not staged or not _known(candidate) or not _known(other):
        return {"repairs": None, "prompts": prompts, "labels": [], "note": UNKNOWN_UNTIL_STAGED}
    config = read_target_config(options.target)
    shape = config.shape
    settings = repair_settings(
        _settings(candidate),
        _settings(other),
        shape.num_layers,
        shape.vocab_size,
        special_tokens(load_tokenizer(options.target)),
    )
    walk = plan["estimate"]["phases"].get("drafter", 0.0)
    costs = {s["label"]: walk * _block_ratio(s, candidate["block_size"]) for s in settings}
    float32, not_tried = _float32_repair(options, plan, config, settings, facts)
    for setting, seconds in float32:
        settings.append(setting)
        costs[setting["label"]] = walk + seconds
    first = sum(costs.values())
    by_kind: dict[str, float] = {}
    for setting in settings:
        by_kind[setting["setting"]] = by_kind.get(setting["setting"], 0.0) + costs[setting["label"]]
    # The worst second round: every other kind than the best's tried again (the best's being
    # the cheapest kind), and two walks more: the best repair alone, then the final pair.
    second = first - min(by_kind.values(), default=0.0) + 2 * walk
    # Each repair found is controlled on the other drafter: at most one per kind, here.
    second += len(by_kind) * plan["estimate"]["phases"].get("reference_drafter", walk)
    # Each drafter walked once more with its features zeroed (the share of the gap in them).
    blind = walk + plan["estimate"]["phases"].get("reference_drafter", walk)
    expected = plan["estimate"]["seconds"] + first + blind
    return {
        "repairs": len(settings),
        "prompts": prompts,
        "walks": len(settings) * prompts,
        "labels": [s["label"] for s in settings],
        "not_tried": not_tried,
        "seconds": round(expected, 3),
        "seconds_up_to": round(expected + second if settings else expected, 3),
        "threads": plan["host"]["threads"],
    }


def _float32_repair(
    options: EvalOptions,
    plan: dict[str, Any],
    config: TargetConfig,
    settings: list[dict[str, Any]],
    facts: HostFacts | None,
) -> tuple[list[tuple[dict[str, Any], float]], list[dict[str, Any]]]:
    """The float32-features repair as the run decides it (repair_runs._float32_features), with
    its cost beyond the walk: the target's hidden states in float32 as eval's plan of the same
    flags in float32 estimates them (cached ones cost nothing); or as not tried, with why."""
    target = plan["target"]
    dtype = target["dtype"] or target["saved_dtype"]
    layers = sorted(
        {*plan["drafter"]["target_layer_ids"]}
        | {i for s in settings if s["setting"] == "target_layer_ids" for i in s["value"]}
    )
    float32 = dtype_settings(dtype, config.drifts_up_to(layers))
    if not float32:
        return [], []
    available = plan["host"]["memory_available_bytes"]
    shortfall = float32_shortfall(target["saved_dtype"], target["saved_bytes"], available)
    if shortfall is not None:
        return [], [{**setting, "why": shortfall} for setting in float32]
    in_float32 = make_plan(dataclasses.replace(options, target_dtype="float32"), facts)
    phases = in_float32["estimate"]["phases"]
    seconds = phases.get("load_target", 0.0) + phases.get("hidden_states", 0.0)
    return [(setting, seconds) for setting in float32], []


def _known(drafter: dict[str, Any] | None) -> bool:
    return bool(
        drafter
        and drafter["block_size"]
        and drafter["target_layer_ids"] is not None
        and drafter["num_hidden_layers"]
    )


def _settings(drafter: dict[str, Any]) -> SimpleNamespace:
    names = ("target_layer_ids", "block_size", "mask_token_id", "num_hidden_layers")
    return SimpleNamespace(**{name: drafter[name] for name in (*names, "layer_types", "is_causal")})


def _block_ratio(setting: dict[str, Any], block_size: int) -> float:
    return setting["value"] / block_size if setting["setting"] == "block_size" else 1.0


def summary_lines(plan: dict[str, Any]) -> list[str]:
    """The diagnose part for people (the workstation draws its own view from the JSON)."""
    part = plan["diagnose"]
    if part["repairs"] is None:
        return [f"diagnose: repairs {part['note']}; {part['prompts']} prompts"]
    return [
        f"diagnose: {part['repairs']} repairs × {part['prompts']} prompts "
        f"= {part['walks']} walks of the candidate",
        *(f"diagnose: not tried: {s['label']} ({s['why']})" for s in part["not_tried"]),
        f"diagnose estimate: ~{part['seconds']:.0f} s on {part['threads']} threads, up to "
        f"~{part['seconds_up_to']:.0f} s if a repair is found (the others are tried again on it)",
    ]
