"""`diagnose`: why is this drafter worse than another? Both on the same prompts and target
features (the eval pipeline and its cache), then a ranked list of findings
(findings.py), most likely cause first.

What is measured, for the candidate and the other drafter alike: τ and per-slot acceptance,
calibration per slot, τ by context length and by prompt set, per-module weight norms, and the
features' provenance and fidelity record. Then repairs: the candidate re-evaluated on the
same prompts, in the same τ convention as its own τ, with one setting changed at a time
(target layer ids: each ±1, all ±1, the default rule's, the other drafter's; block size: half,
double, the other's, all of its slots drafted and scored; mask token: the other drafter's and
the tokenizer's special tokens). Each repair is measured (repair_stats.py): Δτ with its paired
interval, the share of the gap it closes with Fieller's interval, and whether it survives
Holm's correction over all repairs tried and the minimum effect.

A candidate that does not load strictly is diagnosed from its parameters alone (the `fc`
width against the layer ids its config names): nothing else can be measured.

The output (written to --out) is one JSON object: `findings` (ranked) plus the data behind
them, for the workstation's summary and report.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.progress import Progress, Timer
from dflash_eval.diagnose import findings, repair_stats, stats
from dflash_eval.diagnose.repairs import dtype_settings, repair_settings, special_tokens
from dflash_eval.drafter.checkpoint import read_drafter
from dflash_eval.drafter.health import NonFiniteWeights
from dflash_eval.drafter.loaders import LoadedDrafter
from dflash_eval.drafter.pickle_policy import PicklePolicy
from dflash_eval.reference import pipeline
from dflash_eval.run import evaluate, inputs, record
from dflash_eval.run.drafters import ddtree_budgets, load_for_run
from dflash_eval.run.options import EvalOptions
from dflash_eval.run.results import write_results
from dflash_eval.run.threads import default_threads, host_cores
from dflash_eval.target.features import float32_shortfall, weight_bytes
from dflash_eval.target.model import DTYPES, load_tokenizer, stop_token_ids, target_identity
from dflash_eval.target.source import TargetSource
from dflash_eval.walk.metrics import PromptWalk, summarize, walk_prompt
from dflash_eval.walk.predict import BorrowedHead

DIAGNOSIS_FORMAT = 2  # 2: measured repairs replace scored probes
REPAIR_WALK = {"budgets": []}  # repairs are judged on vanilla τ


@dataclass
class DiagnoseOptions:
    run: EvalOptions  # checkpoint: the candidate; reference_drafter: the drafter it is held to
    against: str = "reference"  # how the workstation names the other drafter


@dataclass
class Walked:
    """One drafter's walks over sequences, with the calibration statistics of its rounds."""

    walks: list[PromptWalk]
    slot_stats: list[dict[int, list[stats.SlotStats]]]


def run_diagnose(options: DiagnoseOptions, progress: Progress) -> dict[str, Any]:
    run = options.run
    if run.reference_drafter is None:
        raise HarnessError("diagnose needs the drafter to compare with: pass --reference-drafter.")
    started = time.perf_counter()
    torch.set_num_threads(run.threads or default_threads(host_cores()))
    inputs.check_paths(run)
    prompts = inputs.load_prompts(run)
    timer, warnings = Timer(), []
    target = TargetSource(run.target, run.target_dtype, timer, progress)
    tokenizer = load_tokenizer(run.target)
    stops = stop_token_ids(run.target, tokenizer)
    try:
        candidate = load_for_run(run.checkpoint, run, target.shape, progress, warnings)
    except HarnessError as error:
        diagnosis = _unloadable(options, error, target.shape.hidden_size)
        write_results(run.out, diagnosis)
        return diagnosis
    other = load_for_run(run.reference_drafter, run, target.shape, progress, warnings, candidate)
    # The DDTree budgets as eval resolves them (its default; none for a DFlash-2 drafter).
    run = dataclasses.replace(run, ddtree=ddtree_budgets(run.ddtree, [candidate, other]))
    options = dataclasses.replace(options, run=run)
    drafters = {"drafter": candidate.config, "reference drafter": other.config}
    parts = evaluate._target_side(
        run,
        prompts,
        None,
        target,
        None,  # completions from the target itself: a diagnosis never asks SGLang
        tokenizer,
        stops,
        target_identity(run.target),
        drafters,
        torch.get_num_threads(),
        warnings,
        progress,
        timer,
    )
    head = target.embedding_and_head()
    sides = {}
    for role, loaded in (("candidate", candidate), ("other", other)):
        with timer.phase(f"diagnose_{role}"):
            walked = _walk(loaded, parts.sequences, head, run, progress, role)
        sides[role] = _side(loaded, walked, parts, run)
    sides["candidate"]["training_run"] = run.training_run
    base = stats.per_prompt_tau(sides["candidate"].pop("_walks"))
    theirs = stats.per_prompt_tau(sides["other"].pop("_walks"))
    with timer.phase("blind"):
        blind = [_blind_taus(loaded, parts, head, run) for loaded in (candidate, other)]
    for role, taus, without in (("candidate", base, blind[0]), ("other", theirs, blind[1])):
        sides[role]["feature_reliance"] = stats.paired_difference(taus, without)
    with timer.phase("repairs"):
        repairs = _repairs(
            options, candidate, other, parts, head, tokenizer, (base, theirs), progress
        )
    repairs["features"] = _feature_share((base, theirs), blind, repairs["tried"])
    diagnosis = {
        "format": DIAGNOSIS_FORMAT,
        "against": options.against,
        "candidate": sides["candidate"],
        "other": sides["other"],
        "gap": stats.paired_difference(theirs, base),
        "features": parts.features,
        "repairs": repairs,
        "warnings": warnings,
        "timings": {**timer.seconds, "total": time.perf_counter() - started},
    }
    diagnosis["findings"] = findings.rank(diagnosis)
    write_results(run.out, diagnosis)
    return diagnosis


def _side(
    loaded: LoadedDrafter, walked: Walked, parts: record.RunParts, run: EvalOptions
) -> dict[str, Any]:
    """Everything measured of one drafter (`_walks` is taken out once the gap is known)."""
    sequences = parts.sequences
    first_anchors = [seq.span.first_anchor for seq in sequences if seq.span is not None]
    return {
        "checkpoint": str(loaded.source.path),
        "step": loaded.source.step,
        "drafter": record.drafter_block(loaded),
        "metrics": summarize(walked.walks, loaded.config.block_size, run.ddtree),
        "calibration": stats.calibration(walked.walks, walked.slot_stats),
        "by_context_length": stats.by_context_length(
            walked.walks, first_anchors, run.max_new_tokens
        ),
        "by_prompt_set": stats.by_prompt_set(
            [seq.prompt.dataset or "prompts" for seq in sequences], walked.walks
        ),
        "weights": stats.module_norms(loaded.model),
        "_walks": walked.walks,
    }


def _walk(
    loaded: LoadedDrafter,
    sequences: list[pipeline.Sequence],
    head: tuple[torch.Tensor, torch.Tensor],
    run: EvalOptions,
    progress: Progress,
    phase: str,
    layer_ids: list[int] | None = None,
    block_size: int | None = None,
    walk_block: int | None = None,
    budgets: list[int] | None = None,
    mask_token_id: int | None = None,
    is_causal: bool | None = None,
    blind: bool = False,
) -> Walked:
    """Walk every sequence with this drafter; the keywords change one setting (a repair):
    the feature layers, the block the drafter sees and the slots the walk scores, the mask
    token of the block's unknown slots, the attention rule of every layer; `blind`: the
    target features zeroed (what the drafter makes of its block alone)."""
    config = loaded.config
    dtype = DTYPES[loaded.dtype]
    mask = config.mask_token_id if mask_token_id is None else mask_token_id
    borrowed = BorrowedHead.from_target(*head, mask, dtype)
    layer_ids = list(layer_ids or config.target_layer_ids)
    block_size = block_size or config.block_size
    walk_block = walk_block or block_size
    budgets = run.ddtree if budgets is None else budgets
    walked = Walked([], [])
    progress.progress(phase, 0, len(sequences))
    with _attention_rule(loaded, is_causal):
        for done, seq in enumerate(sequences, start=1):
            assert seq.span is not None, "references are made before the walks"
            features = torch.cat([seq.hidden[i] for i in layer_ids], dim=-1).to(dtype)
            if blind:
                features = torch.zeros_like(features)
            predictor = stats.CalibratingPredictor(
                loaded.model,
                borrowed,
                seq.tokens,
                features,
                seq.span.first_anchor,
                block_size,
                max([1, *budgets]),
                chunk=run.chunk_anchors,
                last_anchor=seq.span.limit - 1,
            )
            walked.walks.append(
                walk_prompt(predictor, seq.tokens, seq.span, walk_block, budgets, run.max_blocks)
            )
            walked.slot_stats.append(predictor.slot_stats)
            progress.progress(phase, done, len(sequences))
    return walked


def _blind_taus(
    loaded: LoadedDrafter,
    parts: record.RunParts,
    head: tuple[torch.Tensor, torch.Tensor],
    run: EvalOptions,
) -> list[float | None]:
    """The drafter's per-prompt τ with the target features zeroed (what it makes of its
    block alone), in the repairs' τ convention."""
    quiet = Progress(quiet=True)
    walked = _walk(loaded, parts.sequences, head, run, quiet, "blind", **REPAIR_WALK, blind=True)
    return stats.per_prompt_tau(walked.walks)


def _feature_share(
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


@contextmanager
def _attention_rule(loaded: LoadedDrafter, is_causal: bool | None) -> Iterator[None]:
    """The drafter's layers under `is_causal` for every layer while held (None: as its
    config says), as if its config said so; put back after."""
    if is_causal is None:
        yield
        return
    changed = dataclasses.replace(loaded.config, is_causal=is_causal)
    attentions = [layer.self_attn for layer in loaded.model.layers]
    kept = [attention.attention for attention in attentions]
    try:
        for index, attention in enumerate(attentions):
            attention.attention = changed.layer_attention(index)
        yield
    finally:
        for attention, rule in zip(attentions, kept, strict=True):
            attention.attention = rule


def _repairs(
    options: DiagnoseOptions,
    candidate: LoadedDrafter,
    other: LoadedDrafter,
    parts: record.RunParts,
    head: tuple[torch.Tensor, torch.Tensor],
    tokenizer: Any,
    taus: tuple[list[float | None], list[float | None]],
    progress: Progress,
) -> dict[str, Any]:
    """Each repair measured against the candidate as configured and the other drafter, per
    prompt, then judged together (Holm over all of them)."""
    run, config = options.run, candidate.config
    settings = repair_settings(
        config,
        other.config,
        parts.target.shape.num_layers,
        head[0].shape[0],
        special_tokens(tokenizer),
    )
    source, layers = parts.target, _layers_read(settings, config)
    float32, not_tried = _float32_features(source, layers)
    settings += float32
    known = [i for i, pair in enumerate(zip(*taus, strict=True)) if None not in pair]
    if not known:  # no prompt gave both drafters a round: nothing to measure a repair on
        settings = []
    base, theirs = ([t[i] for i in known] for t in taus)
    sequences = {source.dtype_choice.name: _with_layers(parts, layers, options)}
    quiet = Progress(quiet=True)

    def repaired(changes: dict[str, Any]) -> list[float]:
        dtype = changes.get("features_dtype", source.dtype_choice.name)
        if dtype not in sequences:  # computed once, when a repair first asks for them
            sequences[dtype] = _with_layers(parts, layers, options, dtype)
        kept = {k: v for k, v in changes.items() if k != "features_dtype"}
        walked = _walk(
            candidate, sequences[dtype], head, run, quiet, "repair", **REPAIR_WALK, **kept
        )
        every = stats.per_prompt_tau(walked.walks)
        return [every[i] for i in known]

    progress.say(f"Trying {len(settings)} repairs on {len(known)} prompts …")
    tried = _judged(settings, {}, base, theirs, repaired, progress)
    summary = {
        "prompts": len(known),
        "tau_candidate": _mean(base),
        "tau_other": _mean(theirs),
        "min_delta_tau": repair_stats.MIN_DELTA,
        "min_gap_share": repair_stats.MIN_SHARE,
        "alpha": repair_stats.ALPHA,
        "detectable_sd": repair_stats.detectable_effect(len(known), len(settings)),
        "prompts_needed": repair_stats.prompts_needed(len(settings)) if settings else None,
        "tried": tried,
        "not_tried": not_tried,
        "combined": None,
    }
    if tried and tried[0]["verdict"] == repair_stats.FINDING:
        summary["combined"] = _combined(tried[0], settings, base, theirs, repaired, progress)
    return summary


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


def _layers_read(settings: list[dict[str, Any]], config: Any) -> list[int]:
    """Every target layer the candidate or a repair of its layer ids reads."""
    moved = {i for s in settings if s["setting"] == "target_layer_ids" for i in s["value"]}
    return sorted({*moved, *config.target_layer_ids})


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
    parts: record.RunParts, layers: list[int], options: DiagnoseOptions, dtype: str | None = None
) -> list[pipeline.Sequence]:
    """The run's sequences with the hidden states of every layer a repair reads, in the run's
    dtype or `dtype`: from the cache, else computed by a fresh target (the run's own was
    released after its phase)."""
    sequences = [dataclasses.replace(seq, hidden={}) for seq in parts.sequences]
    quiet = Progress(quiet=True)
    source = TargetSource(options.run.target, dtype or options.run.target_dtype, Timer(), quiet)
    shared = {**parts.lookup.shared_key, "target_dtype": str(source.dtype)}
    lookup = dataclasses.replace(parts.lookup, layer_ids=layers, shared_key=shared)
    pipeline.hidden_states(sequences, lookup, source, quiet)
    return sequences


def _unloadable(options: DiagnoseOptions, error: HarnessError, hidden_size: int) -> dict[str, Any]:
    """The diagnosis of a candidate that does not load: its parameters against its config."""
    run = options.run
    policy = PicklePolicy(tuple(run.safe_globals), run.allow_unsafe_pickle)
    source = read_drafter(run.checkpoint, policy)
    diagnosis: dict[str, Any] = {
        "format": DIAGNOSIS_FORMAT,
        "against": options.against,
        "candidate": {
            "checkpoint": str(run.checkpoint),
            "step": source.step,
            "load_error": str(error),
            "load_error_kind": "non-finite" if isinstance(error, NonFiniteWeights) else "strict",
            "config": source.config_dict,
            "shapes": {name: list(t.shape) for name, t in source.state_dict.items()},
        },
        "hidden_size": hidden_size,
    }
    diagnosis["findings"] = findings.rank(diagnosis)
    return diagnosis
