"""What `diagnose` measures of one drafter beyond τ: calibration per slot, acceptance by
context length and by prompt set, per-module weight norms, and paired intervals.

Calibration, per slot k of the rounds the walk ran (unconditional, as P(slot k correct)):
- `confidence`: mean top-1 probability; `accuracy`: how often the top-1 is the target's
  token. A drafter trained on soft targets is flat: confidence far below its accuracy.
- `entropy`: mean entropy (nats) of the slot's distribution;
- `rank`: where the target's token sits in the drafter's distribution: first, close
  (ranks 1..CLOSE_RANK-1: a tree finds it) or lost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from dflash_eval.contract.student import t_quantile
from dflash_eval.drafter.model_dflash2 import DFlash2Drafter
from dflash_eval.walk.metrics import PromptWalk
from dflash_eval.walk.predict import BlockPrediction, Predictor, block_predictions

CLOSE_RANK = 10
# Context-length buckets: the completion split into this many equal spans of anchors.
LENGTH_BUCKETS = 3
# Per slot of one block: top-1 probability, entropy, rank and log-probability of the
# target's token.
SlotStats = tuple[float, float, int, float]


class CalibratingPredictor(Predictor):
    """The harness's predictor, also keeping per slot the top-1 probability, the entropy and
    the rank of the reference token, for every anchor it computes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slot_stats: dict[int, list[SlotStats]] = {}

    def _from_hidden(self, hidden: torch.Tensor, anchors: torch.Tensor) -> list[BlockPrediction]:
        if isinstance(self.drafter, DFlash2Drafter):  # its drafts are the selector's choice
            return super()._from_hidden(hidden, anchors)
        logits = self._logits(hidden)  # [N, b-1, V], as the walk drafts them
        self._record(logits.float(), anchors)
        return block_predictions(logits, self.top_k)

    def _record(self, logits: torch.Tensor, anchors: torch.Tensor) -> None:
        """Per anchor and slot: top-1 probability, entropy, the reference token's rank and
        log-probability (a shortened last block never replaces its anchor's full one)."""
        logprobs = F.log_softmax(logits, dim=-1)
        top1 = logprobs.max(dim=-1).values.exp()  # [N, b-1]
        entropy = -(logprobs.exp() * logprobs).sum(dim=-1)
        slots = torch.arange(1, logits.shape[1] + 1)
        positions = (anchors[:, None] + slots).clamp(max=len(self.tokens) - 1)
        truth = self.tokens[positions]  # [N, b-1]
        true_logit = logits.gather(-1, truth[..., None])
        rank = (logits > true_logit).sum(dim=-1)
        true_logprob = logprobs.gather(-1, truth[..., None])[..., 0]
        known = anchors[:, None] + slots < len(self.tokens)
        for row, anchor in enumerate(anchors.tolist()):
            if anchor in self.slot_stats and logits.shape[1] < self.block_size - 1:
                continue
            width = int(known[row].sum())
            self.slot_stats[anchor] = list(
                zip(
                    top1[row, :width].tolist(),
                    entropy[row, :width].tolist(),
                    rank[row, :width].tolist(),
                    true_logprob[row, :width].tolist(),
                    strict=True,
                )
            )


def calibration(
    walks: Sequence[PromptWalk], stats: Sequence[dict[int, list[SlotStats]]]
) -> list[dict[str, Any]]:
    """Per slot over the walked rounds: confidence, accuracy, entropy and the rank split."""
    rows: dict[int, list[tuple[float, float, int, bool]]] = {}
    for walked, by_anchor in zip(walks, stats, strict=True):
        for anchor, correct in zip(walked.anchors, walked.slot_correct, strict=True):
            for slot, (row, ok) in enumerate(zip(by_anchor[anchor], correct, strict=False), 1):
                rows.setdefault(slot, []).append((*row[:3], ok))
    table = []
    for slot in sorted(rows):
        values = rows[slot]
        count = len(values)
        ranks = [rank for _, _, rank, _ in values]
        table.append(
            {
                "slot": slot,
                "rounds": count,
                "confidence": sum(v[0] for v in values) / count,
                "accuracy": sum(v[3] for v in values) / count,
                "entropy": sum(v[1] for v in values) / count,
                "rank_first": sum(r == 0 for r in ranks) / count,
                "rank_close": sum(0 < r < CLOSE_RANK for r in ranks) / count,
                "rank_lost": sum(r >= CLOSE_RANK for r in ranks) / count,
            }
        )
    return table


def by_context_length(
    walks: Sequence[PromptWalk], first_anchors: Sequence[int], max_new_tokens: int
) -> list[dict[str, Any]]:
    """Mean round length by where in the completion the round starts (equal spans)."""
    width = max(1, math.ceil(max_new_tokens / LENGTH_BUCKETS))
    buckets: list[list[int]] = [[] for _ in range(LENGTH_BUCKETS)]
    for walked, first in zip(walks, first_anchors, strict=True):
        for anchor, length in zip(walked.anchors, walked.lengths, strict=True):
            buckets[min((anchor - first) // width, LENGTH_BUCKETS - 1)].append(length)
    return [
        {
            "from_token": index * width,
            "to_token": min((index + 1) * width, max_new_tokens),
            "rounds": len(lengths),
            "tau": sum(lengths) / len(lengths) if lengths else None,
        }
        for index, lengths in enumerate(buckets)
    ]


def per_prompt_tau(walks: Sequence[PromptWalk]) -> list[float | None]:
    return [sum(w.lengths) / len(w.lengths) if w.lengths else None for w in walks]


def by_prompt_set(datasets: Sequence[str], walks: Sequence[PromptWalk]) -> dict[str, float]:
    """Macro τ per named prompt set."""
    taus: dict[str, list[float]] = {}
    for name, value in zip(datasets, per_prompt_tau(walks), strict=True):
        if value is not None:
            taus.setdefault(name, []).append(value)
    return {name: sum(values) / len(values) for name, values in sorted(taus.items())}


def paired_difference(
    better: Sequence[float | None], base: Sequence[float | None]
) -> dict[str, Any]:
    """Mean per-prompt difference and its 95% half-width (Student's t: valid for a handful
    of prompts; infinite with fewer than two, so one prompt never counts as evidence)."""
    pairs = [(b, a) for b, a in zip(better, base, strict=True) if b is not None and a is not None]
    differences = [b - a for b, a in pairs]
    count = len(differences)
    mean = sum(differences) / count if count else 0.0
    if count < 2:
        return {"mean": mean, "half_width": math.inf, "prompts": count}
    variance = sum((d - mean) ** 2 for d in differences) / (count - 1)
    half = t_quantile(0.975, count - 1) * math.sqrt(variance / count)
    return {"mean": mean, "half_width": half, "prompts": count}


def module_norms(model: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """Per parameter: its norm, whether every value is finite, and (for a norm's scale)
    how far it still is from its initial value of all ones."""
    rows = {}
    for name, parameter in model.state_dict().items():
        values = parameter.detach().float()
        finite = bool(torch.isfinite(values).all())
        row: dict[str, Any] = {
            "norm": float(values.norm()) if finite else None,
            "finite": finite,
            "shape": list(values.shape),
        }
        if values.ndim == 1 and "norm" in name:
            row["from_init"] = float((values - 1).abs().max()) if finite else None
        rows[name] = row
    return rows
