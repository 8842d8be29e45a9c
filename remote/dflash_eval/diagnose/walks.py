"""How `diagnose` walks one drafter over the run's sequences: as configured, with one setting
changed (a repair), or with the target features zeroed; and the calibration statistics of
its rounds."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from dflash_eval.contract.progress import Progress
from dflash_eval.diagnose import stats
from dflash_eval.drafter.loaders import LoadedDrafter
from dflash_eval.reference import pipeline
from dflash_eval.run import record
from dflash_eval.run.options import EvalOptions
from dflash_eval.target.model import DTYPES
from dflash_eval.walk.metrics import PromptWalk, walk_prompt
from dflash_eval.walk.predict import BorrowedHead

REPAIR_WALK = {"budgets": []}  # repairs are judged on vanilla τ


@dataclass
class Walked:
    """One drafter's walks over sequences, with the calibration statistics of its rounds."""

    walks: list[PromptWalk]
    slot_stats: list[dict[int, list[stats.SlotStats]]]


def walk(
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
    with attention_rule(loaded, is_causal):
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


def blind_taus(
    loaded: LoadedDrafter,
    parts: record.RunParts,
    head: tuple[torch.Tensor, torch.Tensor],
    run: EvalOptions,
) -> list[float | None]:
    """The drafter's per-prompt τ with the target features zeroed (what it makes of its
    block alone), in the repairs' τ convention."""
    quiet = Progress(quiet=True)
    walked = walk(loaded, parts.sequences, head, run, quiet, "blind", **REPAIR_WALK, blind=True)
    return stats.per_prompt_tau(walked.walks)


@contextmanager
def attention_rule(loaded: LoadedDrafter, is_causal: bool | None) -> Iterator[None]:
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
