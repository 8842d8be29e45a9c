"""`diagnose`: why is this drafter worse than another? Both on the same prompts and target
features (the eval pipeline and its cache), then a ranked list of findings
(findings.py), most likely cause first.

What is measured, for the candidate and the other drafter alike: τ and per-slot acceptance,
calibration per slot, τ by context length and by prompt set, per-module weight norms, and the
features' provenance and fidelity record. Then probes: the candidate re-evaluated on the first
few prompts with one setting changed at a time (each target layer id ±1, all of them ±1, the
config's default layer ids, another block size); a probe whose τ rises beyond its paired 95%
interval is evidence that the checkpoint was trained with that setting.

A candidate that does not load strictly is diagnosed from its parameters alone (the `fc`
width against the layer ids its config names): nothing else can be measured.

The output (written to --out) is one JSON object: `findings` (ranked) plus the data behind
them, for the workstation's summary and report.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.progress import Progress, Timer
from dflash_eval.diagnose import findings, stats
from dflash_eval.drafter.checkpoint import read_drafter
from dflash_eval.drafter.config import default_target_layer_ids
from dflash_eval.drafter.loaders import LoadedDrafter
from dflash_eval.drafter.pickle_policy import PicklePolicy
from dflash_eval.reference import pipeline
from dflash_eval.run import evaluate, inputs, record
from dflash_eval.run.drafters import ddtree_budgets, load_for_run
from dflash_eval.run.options import EvalOptions
from dflash_eval.run.results import write_results
from dflash_eval.target.model import DTYPES, load_tokenizer, stop_token_ids, target_identity
from dflash_eval.target.source import TargetSource
from dflash_eval.walk.metrics import PromptWalk, summarize, walk_prompt
from dflash_eval.walk.predict import BorrowedHead

DIAGNOSIS_FORMAT = 1
DEFAULT_PROBE_PROMPTS = 4
PROBE_WALK = {"budgets": [], "every_anchor": True}  # probes score every anchor, vanilla only


@dataclass
class DiagnoseOptions:
    run: EvalOptions  # checkpoint: the candidate; reference_drafter: the drafter it is held to
    against: str = "reference"  # how the workstation names the other drafter
    probe_prompts: int = DEFAULT_PROBE_PROMPTS


@dataclass
class Walked:
    """One drafter's walks over sequences, with the calibration statistics of its rounds."""

    walks: list[PromptWalk]
    slot_stats: list[dict[int, list[stats.SlotStats]]]


def run_diagnose(options: DiagnoseOptions, progress: Progress) -> dict[str, Any]:
    run = options.run
    if run.reference_drafter is None:
        raise HarnessError("diagnose needs the drafter to compare with: pass --reference-drafter.")
    if options.probe_prompts < 2:
        raise HarnessError(f"--probe-prompts must be at least 2, got {options.probe_prompts}.")
    started = time.perf_counter()
    if run.threads:
        torch.set_num_threads(run.threads)
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
    with timer.phase("probes"):
        probes = _probes(options, candidate, other, parts, head, progress, timer)
    diagnosis = {
        "format": DIAGNOSIS_FORMAT,
        "against": options.against,
        "candidate": sides["candidate"],
        "other": sides["other"],
        "gap": stats.paired_difference(
            stats.per_prompt_tau(sides["other"].pop("_walks")),
            stats.per_prompt_tau(sides["candidate"].pop("_walks")),
        ),
        "features": parts.features,
        "probes": probes,
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
    every_anchor: bool = False,
) -> Walked:
    """Walk every sequence with this drafter; the keywords change one setting (a probe):
    the feature layers, the block the drafter sees, and the slots the walk scores.
    `every_anchor`: also compute the predictions of the anchors the walk skipped."""
    config = loaded.config
    dtype = DTYPES[loaded.dtype]
    borrowed = BorrowedHead.from_target(*head, config.mask_token_id, dtype)
    layer_ids = list(layer_ids or config.target_layer_ids)
    block_size = block_size or config.block_size
    walk_block = walk_block or block_size
    budgets = run.ddtree if budgets is None else budgets
    walked = Walked([], [])
    progress.progress(phase, 0, len(sequences))
    for done, seq in enumerate(sequences, start=1):
        assert seq.span is not None, "references are made before the walks"
        features = torch.cat([seq.hidden[i] for i in layer_ids], dim=-1).to(dtype)
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
        if every_anchor:
            for anchor in range(seq.span.first_anchor, predictor.last_anchor + 1):
                predictor.draft(anchor)
        walked.slot_stats.append(predictor.slot_stats)
        progress.progress(phase, done, len(sequences))
    return walked


def probe_settings(
    layer_ids: list[int], block_size: int, num_layers: int, other_block: int
) -> list[dict[str, Any]]:
    """One setting changed at a time: each layer id ±1, all ±1, the default rule's ids,
    and the other block sizes (half, double, the other drafter's)."""
    candidates: list[tuple[str, list[int]]] = []
    for index, layer in enumerate(layer_ids):
        for shift in (-1, 1):
            moved = [*layer_ids[:index], layer + shift, *layer_ids[index + 1 :]]
            candidates.append((f"target layer id {layer} → {layer + shift}", moved))
    for shift in (-1, 1):
        candidates.append((f"all target layer ids {shift:+d}", [i + shift for i in layer_ids]))
    default = default_target_layer_ids(num_layers, len(layer_ids))
    candidates.append(("the default rule's target layer ids", default))
    probes, seen = [], {tuple(layer_ids)}
    for label, ids in candidates:
        if tuple(ids) in seen or not all(0 <= i < num_layers for i in ids):
            continue
        seen.add(tuple(ids))
        probes.append({"setting": "target_layer_ids", "label": label, "value": ids})
    for size in sorted({block_size // 2, block_size * 2, other_block} - {block_size}):
        if size >= 2:
            label = f"block size {size} (config {block_size})"
            probes.append({"setting": "block_size", "label": label, "value": size})
    return probes


def _probes(
    options: DiagnoseOptions,
    candidate: LoadedDrafter,
    other: LoadedDrafter,
    parts: record.RunParts,
    head: tuple[torch.Tensor, torch.Tensor],
    progress: Progress,
    timer: Timer,
) -> dict[str, Any]:
    """Each probe against the candidate as configured, on the same few prompts, paired."""
    config, run = candidate.config, options.run
    settings = probe_settings(
        list(config.target_layer_ids),
        config.block_size,
        parts.target.shape.num_layers,
        other.config.block_size,
    )
    layers = sorted({i for p in settings if p["setting"] == "target_layer_ids" for i in p["value"]})
    sample = _probe_sample(parts, sorted({*layers, *config.target_layer_ids}), options, timer)
    progress.say(f"Probing {len(settings)} settings on {len(sample)} prompts …")
    base: dict[int, tuple[list, list]] = {}  # walk block → the candidate as configured
    rows = []
    for probe in settings:
        is_block = probe["setting"] == "block_size"
        walk_block = min(config.block_size, probe["value"]) if is_block else config.block_size
        if walk_block not in base:
            walked = _walk(
                candidate, sample, head, run, progress, "probe", **PROBE_WALK, walk_block=walk_block
            )
            base[walk_block] = _tau_and_loss(walked, walk_block)
        changed = {"block_size": probe["value"]} if is_block else {"layer_ids": probe["value"]}
        walked = _walk(
            candidate,
            sample,
            head,
            run,
            progress,
            "probe",
            **changed,
            **PROBE_WALK,
            walk_block=walk_block,
        )
        taus, losses = _tau_and_loss(walked, walk_block)
        base_taus, base_losses = base[walk_block]
        rows.append(
            {
                **probe,
                "scored_slots": walk_block - 1,
                "tau_base": _mean(base_taus),
                "tau": _mean(taus),
                "difference": stats.paired_difference(taus, base_taus),
                "loss_base": _mean(base_losses),
                "loss": _mean(losses),
                "loss_difference": stats.paired_difference(base_losses, losses),
            }
        )
    return {"prompts": len(sample), "settings": rows}


def _probe_sample(
    parts: record.RunParts, layers: list[int], options: DiagnoseOptions, timer: Timer
) -> list[pipeline.Sequence]:
    """The first prompts with the hidden states of every layer a probe reads: from the
    cache, else computed by a fresh target (the run's own was released after its phase)."""
    sample = [
        dataclasses.replace(seq, hidden={}) for seq in parts.sequences[: options.probe_prompts]
    ]
    lookup, quiet = parts.lookup, Progress(quiet=True)
    probe_lookup = dataclasses.replace(lookup, layer_ids=layers)
    source = TargetSource(options.run.target, options.run.target_dtype, timer, quiet)
    pipeline.hidden_states(sample, probe_lookup, source, quiet)
    return sample


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
            "config": source.config_dict,
            "shapes": {name: list(t.shape) for name, t in source.state_dict.items()},
        },
        "hidden_size": hidden_size,
    }
    diagnosis["findings"] = findings.rank(diagnosis)
    return diagnosis


def _tau_and_loss(walked: Walked, walk_block: int) -> tuple[list, list]:
    return (
        stats.per_prompt_anchor_tau(walked.slot_stats, walk_block - 1),
        stats.per_prompt_loss(walked.walks, walked.slot_stats, walk_block - 1),
    )


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None
