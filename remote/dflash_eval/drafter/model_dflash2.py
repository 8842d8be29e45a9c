"""The DFlash-2 drafter (z-lab's `DFlash2DraftModel`, docs/dflash2.md), on model.py's pieces.

Followed: z-lab/dflash `dflash/model.py` at commit 07ebd93 (the DFlash-2 code is the same at
1012959). A DFlash-2 drafter is a DFlash drafter plus, in every layer, two grouped dynamic
causal convolutions, and a candidate selector after the LM head:

- **Convolution** (`GroupedDynamicCausalConv`): `prepare` convolves the layer-normed block
  before attention (or the MLP) and also computes, from that same normed input, the
  dynamic kernel that `finish` applies to the attention (or MLP) output. Along the block's
  slots, output t = Σ_{o<K} (base[o] + dynamic[t, o]) ⊙ input[t − o]; `base` is per
  channel, `dynamic` per group of `conv_group_size` channels and per output slot.
- **What the convolution sees.** Only the block: the reference runs the drafter layers on
  the block's hidden states ([anchor, MASK…]) while the context enters through attention
  K/V alone, so slot 0 sees zeros before it, never the context. The batched evaluation
  (`forward_blocks`, N blocks as [N, B, H]) convolves each block along its own slots with
  the same zero padding: every block is computed exactly as a single block is.
- **Selector** (`CandidateSelector`): per slot the top `selector_top_k` logits; a
  candidate scores its logit + ⟨predecessor code ⊙ projected hidden, successor code⟩; at
  T = 0 the best one is the slot's draft and the next slot's predecessor (the anchor token
  is slot 1's). On an exact score tie the harness takes the candidate with the larger logit
  (top-k in sorted order); the reference's unsorted top-k leaves that order to the device.

Published checkpoints store the codebooks without `.weight` (the reference renames them in
`from_pretrained`); fit.py's `reference_key_mapping` applies the same renames.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from dflash_eval.drafter.config import DrafterConfig
from dflash_eval.drafter.model import DFlashDrafter, DFlashLayer, Rope


def grouped_causal_convolve(
    x: torch.Tensor, base: torch.Tensor, dynamic: torch.Tensor, group_size: int
) -> torch.Tensor:
    """x [..., T, H], base [K, H], dynamic [..., T, K, G] → [..., T, H], causal along T
    (zeros before slot 0); group g holds channels g·group_size … (g+1)·group_size − 1."""
    *lead, length, hidden = x.shape
    groups = hidden // group_size
    grouped = x.view(*lead, length, groups, group_size)
    out = torch.zeros_like(grouped)
    for offset in range(base.shape[0]):
        # input[t − offset], zero where t < offset: pad the front of T, keep T slots.
        shifted = F.pad(grouped, (0, 0, 0, 0, offset, 0))[..., :length, :, :]
        out = out + base[offset].view(groups, group_size) * shifted
        out = out + dynamic[..., offset, :, None] * shifted
    return out.view_as(x)


class GroupedDynamicCausalConv(nn.Module):
    """One convolution pair: `prepare` before a sub-layer, `finish` after it."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int) -> None:
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))  # [pre/post]
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed x [..., T, H] → (its convolution, the dynamic kernel [..., T, K, G] that
        `finish` applies to the sub-layer's output)."""
        dynamic = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, self.groups)
        before = grouped_causal_convolve(
            x, self.base_kernel[0], dynamic[..., 0, :, :], self.group_size
        )
        return before, dynamic[..., 1, :, :]

    def finish(self, y: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        return grouped_causal_convolve(y, self.base_kernel[1], dynamic, self.group_size)


class DFlash2Layer(DFlashLayer):
    """DFlash's pre-norm layer with a convolution pair around attention and around the MLP."""

    def __init__(self, config: DrafterConfig, layer_index: int) -> None:
        super().__init__(config, layer_index)
        parts = config.dflash2
        assert parts is not None, "DFlash2Layer needs a DFlash-2 config"
        size, kernel, group = config.hidden_size, parts.conv_kernel_size, parts.conv_group_size
        self.attention_conv = GroupedDynamicCausalConv(size, kernel, group)
        self.mlp_conv = GroupedDynamicCausalConv(size, kernel, group)

    def forward(
        self, x: torch.Tensor, *attention_inputs: torch.Tensor | Rope | None
    ) -> torch.Tensor:
        """As DFlashLayer.forward (same arguments after x: rope, context K/V, mask)."""
        return self._convolved(x, lambda normed: self.self_attn(normed, *attention_inputs))

    def forward_uncached(self, x: torch.Tensor, ctx: torch.Tensor, rope: Rope) -> torch.Tensor:
        return self._convolved(x, lambda normed: self.self_attn.forward_uncached(normed, ctx, rope))

    def _convolved(
        self, x: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        normed, after = self.attention_conv.prepare(self.input_layernorm(x))
        x = x + self.attention_conv.finish(attend(normed), after)
        normed, after = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(normed), after)


class CandidateSelector(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Embedding(vocab_size, rank)
        self.successor_codebook = nn.Embedding(vocab_size, rank)
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    def choose(
        self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor
    ) -> torch.Tensor:
        """Greedy (T = 0) path: hidden [N, S, H] and logits [N, S, V] of slots 1..S,
        anchor tokens [N] → chosen token ids [N, S], one slot after the other."""
        unary, candidates = torch.topk(logits, self.top_k, dim=-1)  # [N, S, k]
        projected = self.hidden_projection(hidden)  # [N, S, r]
        successors = self.successor_codebook(candidates)  # [N, S, k, r]
        previous = anchor_ids
        chosen = []
        for slot in range(hidden.shape[1]):
            query = self.predecessor_codebook(previous) * projected[:, slot]  # [N, r]
            pairwise = torch.einsum("nr,nkr->nk", query, successors[:, slot])
            best = (unary[:, slot] + pairwise).argmax(dim=-1)  # [N]
            previous = candidates[:, slot].gather(-1, best[:, None])[:, 0]
            chosen.append(previous)
        return torch.stack(chosen, dim=1)


class DFlash2Drafter(DFlashDrafter):
    layer_class = DFlash2Layer

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__(config)
        parts = config.dflash2
        assert parts is not None and config.vocab_size, "DFlash2Drafter needs a DFlash-2 config"
        self.candidate_selector = CandidateSelector(
            config.hidden_size, config.vocab_size, parts.selector_rank, parts.selector_top_k
        )

    def choose(
        self, hidden: torch.Tensor, head_weight: torch.Tensor, anchor_ids: torch.Tensor
    ) -> torch.Tensor:
        """Final-normed blocks [N, B, H] (forward_blocks) → drafts [N, B−1] at T = 0,
        scored in the drafter's dtype as the reference scores them. The selector reads the
        logits after output_multiplier and the softcap, as the reference's does."""
        slots = hidden[:, 1:]
        logits = self.transform_logits(F.linear(slots, head_weight))
        return self.candidate_selector.choose(slots, logits, anchor_ids)


def drafter_class(config: DrafterConfig) -> type[DFlashDrafter]:
    return DFlashDrafter if config.dflash2 is None else DFlash2Drafter
