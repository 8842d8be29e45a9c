"""`diagnose`'s repairs measured: the candidate walked with one setting changed on the run's
sequences (their hidden states at every layer a repair reads, in float32 too where that is a
repair), each repair's Δτ and share of the gap judged together (repair_stats.py), the best one
combined with the rest, and the share of the gap that lies in what the target features give."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from dflash_eval.contract.progress import Progress, Timer
from dflash_eval.diagnose import repair_stats, stats, walks
from dflash_eval.diagnose.repairs import dtype_settings, repair_settings, special_tokens
from dflash_eval.drafter.loaders import LoadedDrafter
from dflash_eval.reference import pipeline
from dflash_eval.run import record
from dflash_eval.run.options import EvalOptions
from dflash_eval.target.dtype import float32_shortfall
from dflash_eval.target.files import weight_bytes
from dflash_eval.target.source import TargetSource


def measure_repairs(
    run: EvalOptions,
    candidate: LoadedDrafter,
    other: LoadedDrafter,
    parts: record.RunParts,
    head: tuple[torch.Tensor, torch.Tensor],
    taus: tuple[list[float | None], list[float | None]],
    progress: Progress,
) -> dict[str, Any]:
    """Each repair measured against the candidate as configured and the other drafter, per
    prompt, then judged together (Holm over all of them)."""
    settings, not_tried, layers = _repairs_to_try(
        candidate.config, other.config, parts.target, head[0].shape[0]
    )
    known = [i for i, pair in enumerate(zip(*taus, strict=True)) if None not in pair]
    if not known:  # no prompt gave both drafters a round: nothing to measure a repair on
        settings = []
    base, theirs = ([t[i] for i in known] for t in taus)
    walked = _RepairWalks(parts, layers, run, head, known)

    def repaired(changes: dict[str, Any]) -> list[float]:
        return walked.taus(candidate, changes)

    progress.say(f"Trying {len(settings)} repairs on {len(known)} prompts …")
    tried = _judged(settings, {}, base, theirs, repaired, progress)
    for row in tried:  # the control: the same change made to the other drafter
        if row["verdict"] == repair_stats.FINDING and _fits(row, other.config):
            mine, changed = repaired(_changes(row)), walked.taus(other, _changes(row))
            row["control"] = repair_stats.as_dict_control(
                repair_stats.control(base, mine, theirs, changed)
            )
    summary = _summary(len(known), base, theirs, len(settings), tried, not_tried)
    if tried and tried[0]["verdict"] == repair_stats.FINDING:
        summary["combined"] = _combined(tried[0], settings, base, theirs, repaired, progress)
    return summary


def _repairs_to_try(
    config: Any, other: Any, source: TargetSource, vocab_rows: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    """The repairs to try, those not tried (with why), and every target layer they read."""
    tokens = special_tokens(source.tokenizer)
    settings = repair_settings(config, other, source.shape.num_layers, vocab_rows, tokens)
    layers = _layers_read(settings, config, other)
    float32, not_tried = _float32_features(source, layers)
    return settings + float32, not_tried, layers


class _RepairWalks:
    """A drafter walked with some settings changed, its τ on the prompts both drafters
    scored. Each walk is done once (the best repair is asked for again, and for its control),
    and the sequences in another features dtype are computed when a repair first asks."""

    def __init__(
        self,
        parts: record.RunParts,
        layers: list[int],
        run: EvalOptions,
        head: tuple[torch.Tensor, torch.Tensor],
        known: list[int],
    ) -> None:
        self.parts, self.layers, self.run, self.head, self.known = parts, layers, run, head, known
        self.dtype = parts.target.dtype_choice.name
        self.sequences = {self.dtype: _with_layers(parts, layers, run)}
        self.walked: dict[tuple, list[float]] = {}

    def taus(self, drafter: LoadedDrafter, changes: dict[str, Any]) -> list[float]:
        key = (id(drafter), *sorted((k, repr(v)) for k, v in changes.items()))
        if key not in self.walked:
            self.walked[key] = self._walk(drafter, changes)
        return self.walked[key]

    def _walk(self, drafter: LoadedDrafter, changes: dict[str, Any]) -> list[float]:
        dtype = changes.get("features_dtype", self.dtype)
        if dtype not in self.sequences:
            self.sequences[dtype] = _with_layers(self.parts, self.layers, self.run, dtype)
        kept = {k: v for k, v in changes.items() if k != "features_dtype"}
        sequences, quiet = self.sequences[dtype], Progress(quiet=True)
        walked = walks.walk(
            drafter, sequences, self.head, self.run, quiet, "repair", **walks.REPAIR_WALK, **kept
        )
        every = stats.per_prompt_tau(walked.walks)
        return [every[i] for i in self.known]


def _summary(
    prompts: int,
    base: list[float],
    theirs: list[float],
    repairs: int,
    tried: list[dict[str, Any]],
    not_tried: list[dict[str, Any]],
) -> dict[str, Any]:
    """The record of the repairs, with the thresholds they were judged by and the power a
    family of `repairs` repairs on `prompts` prompts has."""
    return {
        "prompts": prompts,
        "tau_candidate": _mean(base),
        "tau_other": _mean(theirs),
        "min_delta_tau": repair_stats.MIN_DELTA,
        "min_gap_share": repair_stats.MIN_SHARE,
        "alpha": repair_stats.ALPHA,
        "detectable_sd": repair_stats.detectable_effect(prompts, repairs),
        "prompts_needed": repair_stats.prompts_needed(repairs) if repairs else None,
        "tried": tried,
        "not_tried": not_tried,
        "combined": None,
    }


def _float32_features(
    source: TargetSource, layers: list[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The repair "target features in float32", where the run's drift with their dtype: to
    try, or not tried (with why) when the target's float32 weights do not fit in the memory
    the run's own dtype choice measured."""
    float32 = dtype_settings(source.dtype_choice.name, source.config.drifts_up_to(layers))
    if not float32:
        return [], []
    saved = source.config.saved_dtype
    shortfall = float32_shortfall(saved, weight_bytes(source.path), source.available_bytes)
    if shortfall is None:
        return float32, []
    return [], [{**setting, "why": shortfall} for setting in float32]


def _layers_read(settings: list[dict[str, Any]], config: Any, other: Any) -> list[int]:
    """Every target layer either drafter or a repair of the layer ids reads."""
    moved = {i for s in settings if s["setting"] == "target_layer_ids" for i in s["value"]}
    return sorted({*moved, *config.target_layer_ids, *other.target_layer_ids})


def _fits(setting: dict[str, Any], other: Any) -> bool:
    """Whether the other drafter can take the change: as many layer ids as its `fc` reads."""
    if setting["setting"] == "target_layer_ids":
        return len(setting["value"]) == len(other.target_layer_ids)
    return True


def _changes(setting: dict[str, Any]) -> dict[str, Any]:
    """A repair's setting as `_walk` takes it (a larger block is scored on all its slots)."""
    name, value = setting["setting"], setting["value"]
    if name == "target_layer_ids":
        return {"layer_ids": value}
    if name == "block_size":
        return {"block_size": value, "walk_block": value}
    return {name: value}  # the mask token, the attention rule, the features' dtype


def _judged(
    settings: list[dict[str, Any]],
    applied: dict[str, Any],
    base: list[float],
    theirs: list[float],
    repaired: Callable[[dict[str, Any]], list[float]],
    progress: Progress,
) -> list[dict[str, Any]]:
    """Each setting tried on top of `applied`, measured against `base`, judged together."""
    measured, rows = [], {}
    for done, setting in enumerate(settings, start=1):
        taus = repaired({**applied, **_changes(setting)})
        measured.append(repair_stats.measure(setting["label"], base, taus, theirs))
        rows[setting["label"]] = {**setting, "tau": _mean(taus)}
        progress.progress("repairs", done, len(settings))
    return [{**rows[r.name], **repair_stats.as_dict(r)} for r in repair_stats.judge(measured)]


def _combined(
    best: dict[str, Any],
    settings: list[dict[str, Any]],
    base: list[float],
    theirs: list[float],
    repaired: Callable[[dict[str, Any]], list[float]],
    progress: Progress,
) -> dict[str, Any]:
    """The best repair applied, the remaining kinds of repair tried again on top of it: the
    steps taken (the second only when it is a finding there too) and the share closed."""
    applied = _changes(best)
    rest = [s for s in settings if s["setting"] != best["setting"]]
    progress.say(f"With {best['label']}: trying {len(rest)} more repairs …")
    then = _judged(rest, applied, repaired(applied), theirs, repaired, progress)
    steps = [best]
    if then and then[0]["verdict"] == repair_stats.FINDING:
        steps.append(then[0])
        applied = {**applied, **_changes(then[0])}
    final = repaired(applied)
    closed = repair_stats.measure("combined", base, final, theirs).gap_closed
    return {
        "steps": [step["label"] for step in steps],
        "tau": _mean(final),
        "gap_closed": repair_stats.as_dict_interval(closed),
        "then_tried": then,
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _with_layers(
    parts: record.RunParts, layers: list[int], run: EvalOptions, dtype: str | None = None
) -> list[pipeline.Sequence]:
    """The run's sequences with the hidden states of every layer a repair reads, in the run's
    dtype or `dtype`: from the cache, else computed by a fresh target (the run's own was
    released after its phase)."""
    sequences = [dataclasses.replace(seq, hidden={}) for seq in parts.sequences]
    quiet = Progress(quiet=True)
    source = TargetSource(run.target, dtype or run.target_dtype, Timer(), quiet)
    shared = {**parts.lookup.shared_key, "target_dtype": str(source.dtype)}
    lookup = dataclasses.replace(parts.lookup, layer_ids=layers, shared_key=shared)
    pipeline.hidden_states(sequences, lookup, source, quiet)
    return sequences


def feature_share(
    taus: tuple[list[float | None], list[float | None]],
    blind: list[list[float | None]],
    tried: list[dict[str, Any]],
) -> dict[str, Any] | None:
    """The share of the gap the target features account for: the candidate as if it gained
    from its features what the other drafter gains from them (its τ without them plus the
    other's gain), measured per prompt as a repair is and judged within the repairs' family.
    None when no prompt gave all four walks a round."""
    rows = [r for r in zip(*taus, *blind, strict=True) if None not in r]
    if not rows:
        return None
    base, theirs, base_blind, their_blind = (list(column) for column in zip(*rows, strict=True))
    read_as_theirs = [b + t - o for b, t, o in zip(base_blind, theirs, their_blind, strict=True)]
    measured = repair_stats.measure("features", base, read_as_theirs, theirs)
    judged = repair_stats.judge_within(measured, [r["p_value"] for r in tried])
    return {
        "prompts": len(rows),
        "tau": _mean(read_as_theirs),
        "tau_blind": {"candidate": _mean(base_blind), "other": _mean(their_blind)},
        **repair_stats.as_dict(judged),
    }
