"""Drafter predictions for every anchor of one sequence, computed lazily in batched chunks.

The acceptance walk (metrics.py) jumps from anchor to anchor by data-dependent amounts, so
instead of one drafter forward per visited block, the drafter runs over chunks of
*consecutive* anchors at once (model.forward_blocks with a block-structured mask) and the
walk reads the precomputed predictions. `PerBlockPredictor` runs one forward per anchor
on the same context cache, the same maths without the batching, kept for comparison
(`--per-block`, benchmarks/harness.py, tests). `SampledPredictor` reads the same forward at
T > 0: each slot's acceptance probability along the sampled path.

A DFlash-2 drafter's draft is its candidate selector's sequential choice (drafter/model_dflash2.py),
not the per-slot argmax; it has no DDTree candidates and no T > 0 evaluation here
(docs/dflash2.md says why).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from dflash_eval.drafter.health import require_finite_logits
from dflash_eval.drafter.model import ContextCache, DFlashDrafter
from dflash_eval.drafter.model_dflash2 import DFlash2Drafter
from dflash_eval.walk.sampling import token_probs
from dflash_eval.walk.sampling_settings import Sampling


@dataclass
class BorrowedHead:
    """The target parts the drafter uses, in the drafter's dtype."""

    embed_weight: torch.Tensor  # [V, H]
    head_weight: torch.Tensor  # [V, H]
    mask_token_id: int

    @classmethod
    def from_target(
        cls,
        embed: torch.Tensor,
        head: torch.Tensor,
        mask_token_id: int,
        dtype: torch.dtype,
        device: str = "cpu",
    ) -> BorrowedHead:
        return cls(
            embed.detach().to(device=device, dtype=dtype),
            head.detach().to(device=device, dtype=dtype),
            mask_token_id,
        )


def default_chunk(block_size: int, vocab_size: int, context_length: int, heads: int) -> int:
    """Anchors per batched pass (a power of two ≤ 64) that bounds memory whatever the
    completion length: logits N·(B-1)·V ≤ 256 MiB fp32, attention scores
    heads·N·B·(S+N·B) ≤ 128 MiB, and N·B ≤ max(128, S/4) so that the keys of the other
    blocks in the pass (masked out) add at most a quarter to the attention work."""
    chunk = 64
    while chunk > 1 and (
        chunk * (block_size - 1) * vocab_size * 4 > 256 << 20
        or heads * chunk * block_size * (context_length + chunk * block_size) * 4 > 128 << 20
        or chunk * block_size > max(128, context_length // 4)
    ):
        chunk //= 2
    return chunk


class Predictor:
    """Draft predictions per anchor for one sequence (batched, lazy, chunked).

    tokens: prompt + reference (N tokens); features: [N, K·H] target features (only
    positions < anchor are ever seen by an anchor); anchors run from `first_anchor` to
    `last_anchor` (default N-2, the last with a known next token).
    top_k: the largest DDTree budget (a tree of b nodes uses at most b ranks per slot;
    at most the vocabulary, as in the DDTree authors' code).
    """

    def __init__(
        self,
        drafter: DFlashDrafter,
        head: BorrowedHead,
        tokens: list[int],
        features: torch.Tensor,
        first_anchor: int,
        block_size: int,
        top_k: int,
        chunk: int | None = None,
        last_anchor: int | None = None,
    ) -> None:
        self.drafter, self.head = drafter, head
        self.tokens = torch.tensor(tokens)
        known_last = len(tokens) - 2
        self.first_anchor = first_anchor
        self.last_anchor = known_last if last_anchor is None else min(last_anchor, known_last)
        self.block_size, self.top_k = block_size, min(top_k, head.head_weight.shape[0])
        self.chunk = chunk or default_chunk(
            block_size,
            head.head_weight.shape[0],
            len(tokens),
            drafter.config.num_attention_heads,
        )
        self._features = features
        self._cache: ContextCache | None = None
        self._blocks: dict[int, BlockPrediction] = {}
        self._short_blocks: dict[tuple[int, int], BlockPrediction] = {}
        self.blocks_computed = 0
        self.seconds = 0.0

    def draft(self, anchor: int, size: int | None = None) -> list[int]:
        """The greedy token of each slot 1..B-1 of the block at `anchor` (of `size` slots
        instead of B, for z-lab's shortened last block)."""
        return self._block(anchor, size).draft

    def tree(
        self, anchor: int, size: int | None = None
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Top-k ids and log-probs, best first, for slots 1..d of the block at `anchor`,
        where d is the deepest slot a best-first tree of ≤ k nodes can reach."""
        block = self._block(anchor, size)
        return block.tree_ids, block.tree_logprobs

    def _block(self, anchor: int, size: int | None) -> BlockPrediction:
        if size is not None and size != self.block_size:
            # A shortened block (at most one per walk): a non-causal layer sees fewer mask
            # slots, so its predictions differ from the full block's.
            if (anchor, size) not in self._short_blocks:
                began = time.perf_counter()
                single = torch.tensor([anchor])
                (prediction,) = self._predict(single, size)
                self.seconds += time.perf_counter() - began
                self.blocks_computed += 1
                self._short_blocks[anchor, size] = prediction
            return self._short_blocks[anchor, size]
        if anchor not in self._blocks:
            self._compute_around(anchor)
        return self._blocks[anchor]

    def _compute_around(self, anchor: int) -> None:
        if not self.first_anchor <= anchor <= self.last_anchor:
            raise IndexError(f"anchor {anchor} outside {self.first_anchor}..{self.last_anchor}")
        start = self.first_anchor + (anchor - self.first_anchor) // self.chunk * self.chunk
        anchors = torch.arange(start, min(start + self.chunk, self.last_anchor + 1))
        began = time.perf_counter()
        predictions = self._predict(anchors)
        self.seconds += time.perf_counter() - began
        self.blocks_computed += len(anchors)
        self._blocks.update(zip(anchors.tolist(), predictions, strict=True))

    @torch.inference_mode()
    def _context(self) -> ContextCache:
        if self._cache is None:
            # Anchors reach N-2, so context positions 0..N-3 are the most ever seen.
            ctx = self.drafter.fuse_context(self._features[: self.last_anchor])
            self._cache = self.drafter.context_cache(ctx)
        return self._cache

    @torch.inference_mode()
    def _predict(self, anchors: torch.Tensor, size: int | None = None) -> list[BlockPrediction]:
        embeds = self._block_embeds(anchors, size)
        hidden = self.drafter.forward_blocks(embeds, anchors, self._context())
        return self._from_hidden(hidden, anchors)

    def _from_hidden(self, hidden: torch.Tensor, anchors: torch.Tensor) -> list[BlockPrediction]:
        """Final hidden [N, B, H] → each block's prediction (a DFlash-2 draft is its
        selector's choice, over logits transformed as the plain drafter's are)."""
        if isinstance(self.drafter, DFlash2Drafter):
            drafts = self.drafter.choose(hidden, self.head.head_weight, self.tokens[anchors])
            return [BlockPrediction(draft, [], []) for draft in drafts.tolist()]
        return block_predictions(self._logits(hidden), self.top_k)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final hidden [N, B, H] → float32 logits [N, B-1, V] of the drafted slots."""
        return self.drafter.logits(hidden[:, 1:], self.head.head_weight)

    def _block_embeds(self, anchors: torch.Tensor, size: int | None = None) -> torch.Tensor:
        """[g[s], MASK, …, MASK] embedded → [N, B, H] (B = size when given)."""
        block_tokens = torch.full((len(anchors), size or self.block_size), self.head.mask_token_id)
        block_tokens[:, 0] = self.tokens[anchors]
        return self.drafter.embed_block(self.head.embed_weight, block_tokens)


# Log-prob slack when deciding which slots a tree can reach: far above the rounding of a
# float32 cumulative sum, far below any real gap, and a kept slot costs only one top-k.
REACH_MARGIN = 1e-3


@dataclass
class BlockPrediction:
    draft: list[int]  # greedy token per slot 1..B-1 (DFlash-2: the selector's choice)
    tree_ids: list[list[int]]  # [d][k] top-k per slot 1..d, best first (DFlash-2: none)
    tree_logprobs: list[list[float]]  # [d][k] their log-softmax values


def block_predictions(logits: torch.Tensor, top_k: int) -> list[BlockPrediction]:
    """Drafted slots' float32 logits [N, B-1, V] → the greedy draft and the DDTree
    candidates of each block.

    Every slot needs the full-vocabulary logits (greedy token, log-softmax normaliser), but
    top-k only matters for the slots a best-first tree of ≤ k nodes can reach. The best
    path to slot j scores P_j = the sum of the slots' top log-probs up to j; if the k-th
    candidate of slot 1 alone scores more than P_j, the k slot-1 candidates are all popped
    before any node at depth j, so none is ever popped (exact, not a heuristic; a margin
    keeps slots that float32 rounding of P_j, or an exact tie, could let in).
    """
    blocks, slots, _ = logits.shape
    logits = logits.reshape(blocks * slots, -1)  # [N·(B-1), V]
    best, greedy = row_max(logits)
    normaliser = (logits - best[:, None]).exp_().sum(dim=-1).log_().add_(best)  # logsumexp
    require_finite_logits(normaliser)
    best_path = (best - normaliser).view(blocks, slots).cumsum(dim=1)  # P_j, non-increasing
    by_slot, normaliser = logits.view(blocks, slots, -1), normaliser.view(blocks, slots)
    first_values, first_ids = torch.topk(by_slot[:, 0], top_k, dim=-1)  # slot 1: always
    first_logprobs = first_values - normaliser[:, :1]
    reach = first_logprobs[:, -1:] - REACH_MARGIN
    deeper = best_path[:, 1:] >= reach  # [N, B-2]: slots 2.. a tree of ≤ k nodes reaches
    values, ids = torch.topk(by_slot[:, 1:][deeper], top_k, dim=-1)
    logprobs = (values - normaliser[:, 1:][deeper][:, None]).tolist()
    ids_list, drafts = ids.tolist(), greedy.view(blocks, slots).tolist()
    firsts = zip(first_ids.tolist(), first_logprobs.tolist(), strict=True)
    predictions, row = [], 0
    for draft, (first_id, first_logprob), extra in zip(
        drafts, firsts, deeper.sum(dim=1).tolist(), strict=True
    ):
        predictions.append(
            BlockPrediction(
                draft,
                [first_id, *ids_list[row : row + extra]],
                [first_logprob, *logprobs[row : row + extra]],
            )
        )
        row += extra
    return predictions


def row_max(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(max, index of its first occurrence) per row, as values.max(dim=-1) returns them.

    On CPU max-with-index is a slow kernel (~3× the time here); when the columns split into
    groups of 64, two quick reductions find the first group holding the max, then the
    first index inside it: the same answer, ties included.
    """
    rows, columns = values.shape
    if columns % 64:
        return values.max(dim=-1)
    groups = values.view(rows, columns // 64, 64)
    best, group = groups.amax(dim=-1).max(dim=-1)
    inside = groups[torch.arange(rows), group].argmax(dim=-1)
    return best, group * 64 + inside


class PerBlockPredictor(Predictor):
    """One drafter forward per anchor (same context cache, same maths, no batching)."""

    @torch.inference_mode()
    def _predict(self, anchors: torch.Tensor, size: int | None = None) -> list[BlockPrediction]:
        predictions = []
        for anchor in anchors:
            single = anchor.reshape(1)
            hidden = self.drafter.forward_blocks(
                self._block_embeds(single, size), single, self._context()
            )
            predictions += self._from_hidden(hidden, single)
        return predictions


class SampledPredictor(Predictor):
    """At T > 0: per anchor, the acceptance probability of each slot along the sampled path,
    r = min(1, q(y) / p(y)) (sampled.py), NaN for slots past the known path.

    Built as a Predictor, then told the path's settings and probabilities (`follow`).
    """

    sampling = Sampling()
    target_probs = torch.zeros(0, dtype=torch.float64)

    def follow(self, sampling: Sampling, target_probs: list[float]) -> None:
        """target_probs[t]: the target's processed probability of tokens[t], t ≥ first_anchor
        (the prompt's positions are never a draft slot)."""
        self.sampling = sampling
        padding = [math.nan] * self.first_anchor
        self.target_probs = torch.tensor(padding + target_probs, dtype=torch.float64)

    def table(self, last_anchor: int) -> torch.Tensor:
        """[anchors first_anchor..last_anchor, B-1] ratios (NaN past the path)."""
        rows = [self._block(a, None) for a in range(self.first_anchor, last_anchor + 1)]
        return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), self.block_size - 1)

    @torch.inference_mode()
    def _predict(  # type: ignore[override]
        self, anchors: torch.Tensor, size: int | None = None
    ) -> list[list[float]]:
        """Whole blocks only: at T > 0 the walk drafts a full block at every anchor."""
        hidden = self.drafter.forward_blocks(self._block_embeds(anchors), anchors, self._context())
        slots = self.block_size - 1
        # The drafter's own logits, with its output_multiplier and softcap, as q sees them.
        logits = self.drafter.logits(hidden[:, 1:], self.head.head_weight)
        logits = logits.reshape(-1, logits.shape[-1])
        positions = anchors[:, None] + torch.arange(1, slots + 1)[None, :]  # [N, B-1]
        known = positions < len(self.tokens)
        path = self.tokens[positions.clamp(max=len(self.tokens) - 1)]
        drafted = token_probs(logits, path.reshape(-1), self.sampling).double().view(-1, slots)
        target = self.target_probs[positions.clamp(max=len(self.tokens) - 1)]
        ratios = torch.where(known, (drafted / target).clamp(max=1.0), float("nan"))
        return ratios.tolist()
