"""Drafter predictions for every anchor of one sequence, computed lazily in batched chunks.

The acceptance walk (metrics.py) jumps from anchor to anchor by data-dependent amounts, so
instead of one drafter forward per visited block, the drafter runs over chunks of
*consecutive* anchors at once (model.forward_blocks with a block-structured mask) and the
walk reads the precomputed predictions. `PerBlockPredictor` runs one forward per anchor
on the same context cache, the same maths without the batching, kept for comparison
(`--per-block`, benchmarks/harness.py, tests).

A DFlash-2 drafter's draft is its candidate selector's sequential choice (model_dflash2.py),
not the per-slot argmax; it has no DDTree candidates (docs/dflash2.md says why).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dflash_eval.model import ContextCache, DFlashDrafter
from dflash_eval.model_dflash2 import DFlash2Drafter


@dataclass
class BorrowedHead:
    """The target parts the drafter uses, in the drafter's dtype."""

    embed_weight: torch.Tensor  # [V, H]
    head_weight: torch.Tensor  # [V, H]
    mask_token_id: int

    @classmethod
    def from_target(
        cls, embed: torch.Tensor, head: torch.Tensor, mask_token_id: int, dtype: torch.dtype
    ) -> BorrowedHead:
        return cls(embed.detach().to(dtype), head.detach().to(dtype), mask_token_id)


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
        self.blocks_computed = 0
        self.seconds = 0.0

    def draft(self, anchor: int) -> list[int]:
        """The greedy token of each slot 1..B-1 of the block at `anchor`."""
        return self._block(anchor).draft

    def tree(self, anchor: int) -> tuple[list[list[int]], list[list[float]]]:
        """Top-k ids and log-probs, best first, for slots 1..d of the block at `anchor`,
        where d is the deepest slot a best-first tree of ≤ k nodes can reach."""
        block = self._block(anchor)
        return block.tree_ids, block.tree_logprobs

    def _block(self, anchor: int) -> BlockPrediction:
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
    def _predict(self, anchors: torch.Tensor) -> list[BlockPrediction]:
        hidden = self.drafter.forward_blocks(self._block_embeds(anchors), anchors, self._context())
        return self._from_hidden(hidden, anchors)

    def _from_hidden(self, hidden: torch.Tensor, anchors: torch.Tensor) -> list[BlockPrediction]:
        if isinstance(self.drafter, DFlash2Drafter):
            drafts = self.drafter.choose(hidden, self.head.head_weight, self.tokens[anchors])
            return [BlockPrediction(draft, [], []) for draft in drafts.tolist()]
        return block_predictions(hidden, self.head.head_weight, self.top_k)

    def _block_embeds(self, anchors: torch.Tensor) -> torch.Tensor:
        """[g[s], MASK, …, MASK] embedded → [N, B, H]."""
        block_tokens = torch.full((len(anchors), self.block_size), self.head.mask_token_id)
        block_tokens[:, 0] = self.tokens[anchors]
        return self.head.embed_weight[block_tokens]


# Log-prob slack when deciding which slots a tree can reach: far above the rounding of a
# float32 cumulative sum, far below any real gap, and a kept slot costs only one top-k.
REACH_MARGIN = 1e-3


@dataclass
class BlockPrediction:
    draft: list[int]  # greedy token per slot 1..B-1 (DFlash-2: the selector's choice)
    tree_ids: list[list[int]]  # [d][k] top-k per slot 1..d, best first (DFlash-2: none)
    tree_logprobs: list[list[float]]  # [d][k] their log-softmax values


def block_predictions(
    hidden: torch.Tensor, head_weight: torch.Tensor, top_k: int
) -> list[BlockPrediction]:
    """Final hidden [N, B, H] → the greedy draft and the DDTree candidates of each block.

    Every slot needs the full-vocabulary logits (greedy token, log-softmax normaliser), but
    top-k only matters for the slots a best-first tree of ≤ k nodes can reach. The best
    path to slot j scores P_j = the sum of the slots' top log-probs up to j; if the k-th
    candidate of slot 1 alone scores more than P_j, the k slot-1 candidates are all popped
    before any node at depth j, so none is ever popped (exact, not a heuristic; a margin
    keeps slots that float32 rounding of P_j, or an exact tie, could let in).
    """
    blocks, block_size, width = hidden.shape
    slots = block_size - 1
    # One flat GEMM over all slots of all blocks (a batched [N, B-1, H] @ Wᵀ is slower).
    logits = F.linear(hidden[:, 1:].reshape(-1, width), head_weight).float()  # [N·(B-1), V]
    best, greedy = row_max(logits)
    normaliser = (logits - best[:, None]).exp_().sum(dim=-1).log_().add_(best)  # logsumexp
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
    def _predict(self, anchors: torch.Tensor) -> list[BlockPrediction]:
        predictions = []
        for anchor in anchors:
            single = anchor.reshape(1)
            hidden = self.drafter.forward_blocks(
                self._block_embeds(single), single, self._context()
            )
            predictions += self._from_hidden(hidden, single)
        return predictions
