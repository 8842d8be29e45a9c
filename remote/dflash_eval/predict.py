"""Drafter predictions for every anchor of one sequence, computed lazily in batched chunks.

The acceptance walk (metrics.py) jumps from anchor to anchor by data-dependent amounts, so
instead of one drafter forward per visited block, the drafter runs over chunks of
*consecutive* anchors at once (model.forward_blocks with a block-structured mask) and the
walk reads the precomputed top-k predictions. `PerBlockPredictor` is the straightforward
one-forward-per-anchor loop kept for comparison (benchmarks/harness.py, tests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dflash_eval.model import ContextCache, DFlashDrafter


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
    """Top-k draft predictions per anchor for one sequence (batched, lazy, chunked).

    tokens: prompt + completion (N tokens); features: [N, K·H] target features (only
    positions < anchor are ever seen by an anchor); anchors run from `first_anchor` to N-2.
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
    ) -> None:
        self.drafter, self.head = drafter, head
        self.tokens = torch.tensor(tokens)
        self.first_anchor, self.last_anchor = first_anchor, len(tokens) - 2
        self.block_size, self.top_k = block_size, top_k
        self.chunk = chunk or default_chunk(
            block_size,
            head.head_weight.shape[0],
            len(tokens),
            drafter.config.num_attention_heads,
        )
        self._features = features
        self._cache: ContextCache | None = None
        self._ids: dict[int, list[list[int]]] = {}
        self._logprobs: dict[int, list[list[float]]] = {}
        self.blocks_computed = 0
        self.seconds = 0.0

    def ids(self, anchor: int) -> list[list[int]]:
        """[B-1][k] token ids, best first, for slots 1..B-1 of the block at `anchor`."""
        if anchor not in self._ids:
            self._compute_around(anchor)
        return self._ids[anchor]

    def logprobs(self, anchor: int) -> list[list[float]]:
        if anchor not in self._logprobs:
            self._compute_around(anchor)
        return self._logprobs[anchor]

    def _compute_around(self, anchor: int) -> None:
        if not self.first_anchor <= anchor <= self.last_anchor:
            raise IndexError(f"anchor {anchor} outside {self.first_anchor}..{self.last_anchor}")
        start = self.first_anchor + (anchor - self.first_anchor) // self.chunk * self.chunk
        anchors = torch.arange(start, min(start + self.chunk, self.last_anchor + 1))
        began = time.perf_counter()
        ids, logprobs = self._predict(anchors)
        self.seconds += time.perf_counter() - began
        self.blocks_computed += len(anchors)
        for index, position in enumerate(anchors.tolist()):
            self._ids[position] = ids[index]
            self._logprobs[position] = logprobs[index]

    @torch.inference_mode()
    def _context(self) -> ContextCache:
        if self._cache is None:
            # Anchors reach N-2, so context positions 0..N-3 are the most ever seen.
            ctx = self.drafter.fuse_context(self._features[: self.last_anchor])
            self._cache = self.drafter.context_cache(ctx)
        return self._cache

    @torch.inference_mode()
    def _predict(self, anchors: torch.Tensor) -> tuple[list, list]:
        hidden = self.drafter.forward_blocks(self._block_embeds(anchors), anchors, self._context())
        return self._top_k(hidden)

    def _block_embeds(self, anchors: torch.Tensor) -> torch.Tensor:
        """[g[s], MASK, …, MASK] embedded → [N, B, H]."""
        block_tokens = torch.full((len(anchors), self.block_size), self.head.mask_token_id)
        block_tokens[:, 0] = self.tokens[anchors]
        return self.head.embed_weight[block_tokens]

    def _top_k(self, hidden: torch.Tensor) -> tuple[list, list]:
        """Final hidden [N, B, H] → per slot 1..B-1 the top-k ids and log-probs (lists)."""
        logits = (hidden[:, 1:] @ self.head.head_weight.T).float()  # [N, B-1, V]
        values, ids = torch.topk(logits, self.top_k, dim=-1)  # [N, B-1, k]
        logprobs = values - torch.logsumexp(logits, dim=-1, keepdim=True)
        return ids.tolist(), logprobs.tolist()


class PerBlockPredictor(Predictor):
    """The straightforward loop: one drafter forward per anchor (same cache, same maths)."""

    @torch.inference_mode()
    def _predict(self, anchors: torch.Tensor) -> tuple[list, list]:
        ids, logprobs = [], []
        for anchor in anchors:
            single = anchor.reshape(1)
            hidden = self.drafter.forward_blocks(
                self._block_embeds(single), single, self._context()
            )
            block_ids, block_logprobs = self._top_k(hidden)
            ids += block_ids
            logprobs += block_logprobs
        return ids, logprobs
