"""A DFlash-2 drafter computed plainly, for the live loop (live_loops.py) to check the harness.

Written from reading z-lab's `DFlash2DraftModel` (dflash/model.py, commit 07ebd93), not from
the harness: one block at a time, every sum written out, nothing imported from dflash_eval.
It reads the drafter from its config.json dict and its parameters under the module names
(after the renames the reference's `from_pretrained` applies). What it has of a plain DFlash
drafter comes from `PlainDrafter` (live_drafter.py): the config reading, the mask rule
(`sees`, position by position) and the logit fields, which the selector reads transformed.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .live_drafter import PlainDrafter, rms


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


def _convolve(x: torch.Tensor, base: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
    """x [T, H] along its T slots, zeros before slot 0: out[t] = Σ_o (base[o] + the dynamic
    weight of t's group) · x[t − o]; dynamic [T, K, G], one weight per group of channels."""
    length, hidden = x.shape
    taps, groups = dynamic.shape[1], dynamic.shape[2]
    out = torch.zeros_like(x)
    for t in range(length):
        for o in range(taps):
            if t - o >= 0:
                per_channel = dynamic[t, o].repeat_interleave(hidden // groups)
                out[t] += (base[o] + per_channel) * x[t - o]
    return out


class PlainDFlash2(PlainDrafter):
    def __init__(self, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        super().__init__(config, weights)
        self.top_k, self.kernel = self.value("selector_top_k"), self.value("conv_kernel_size")
        self.eps = config["rms_norm_eps"]
        self.rotary = Qwen3RotaryEmbedding(Qwen3Config(**config))

    def hidden(
        self, features: torch.Tensor, anchor_token: int, embed: torch.Tensor, size: int
    ) -> torch.Tensor:
        """Final-normed hidden states [size, H] of the block [anchor, MASK…] of `size` slots
        after the context features [S, K·H] of positions 0..S−1."""
        w, eps = self.weights, self.eps
        ctx = rms(features @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
        block = [anchor_token] + [self.mask_token_id] * (size - 1)
        x = embed[block] * float(self.value("input_embedding_scale", 1.0))
        positions = torch.arange(ctx.shape[0] + x.shape[0])[None]
        cos, sin = (t[0] for t in self.rotary(x, positions))  # [S+B, head_dim]
        for i in range(self.config["num_hidden_layers"]):
            p = f"layers.{i}."
            h = rms(x, w[p + "input_layernorm.weight"], eps)
            h, after = self._conv_before(h, p + "attention_conv.")
            h = self._attention(h, ctx, i, cos, sin)
            x = x + _convolve(h, w[p + "attention_conv.base_kernel"][1], after)
            h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
            h, after = self._conv_before(h, p + "mlp_conv.")
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            h = (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
            x = x + _convolve(h, w[p + "mlp_conv.base_kernel"][1], after)
        return rms(x, w["norm.weight"], eps)

    def _conv_before(self, h: torch.Tensor, p: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The convolution before a sub-layer, and the dynamic weights of the one after it
        (both projected from the normed input h)."""
        projected = h @ self.weights[p + "kernel_projection.weight"].T  # [T, 2·K·G]
        dynamic = projected.view(h.shape[0], 2, self.kernel, -1)
        return _convolve(h, self.weights[p + "base_kernel"][0], dynamic[:, 0]), dynamic[:, 1]

    def _attention(
        self, h: torch.Tensor, ctx: torch.Tensor, layer: int, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """Queries from the block; keys and values from [context; block]; the layer's mask."""
        w, c, p = self.weights, self.config, f"layers.{layer}.self_attn."
        head_dim, heads, kv_heads = (
            c["head_dim"],
            c["num_attention_heads"],
            c["num_key_value_heads"],
        )
        both = torch.cat([ctx, h])
        q = (h @ w[p + "q_proj.weight"].T).view(h.shape[0], heads, head_dim)
        k = (both @ w[p + "k_proj.weight"].T).view(both.shape[0], kv_heads, head_dim)
        v = (both @ w[p + "v_proj.weight"].T).view(both.shape[0], kv_heads, head_dim)
        q = rms(q, w[p + "q_norm.weight"], self.eps)
        k = rms(k, w[p + "k_norm.weight"], self.eps)
        q = _rotate(q, cos[-h.shape[0] :, None], sin[-h.shape[0] :, None])
        k = _rotate(k, cos[:, None], sin[:, None])
        start = ctx.shape[0]
        hidden = torch.tensor(
            [
                [not self.sees(layer, start + i, j) for j in range(both.shape[0])]
                for i in range(h.shape[0])
            ]
        )
        out = torch.zeros_like(q)
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = q[:, head] @ k[:, kv].T / math.sqrt(head_dim)  # [B, S+B]
            scores = scores.masked_fill(hidden, float("-inf"))
            out[:, head] = torch.softmax(scores, dim=-1) @ v[:, kv]
        return out.reshape(h.shape[0], -1) @ w[p + "o_proj.weight"].T

    def logits(
        self, features: torch.Tensor, block_ids: list[int], embed: torch.Tensor, head: torch.Tensor
    ) -> torch.Tensor:
        """As PlainDrafter.logits, through the DFlash-2 layers (block_ids: [g[s], MASK…])."""
        return self.draft(features, block_ids[0], embed, head, len(block_ids))[0]

    def draft(
        self,
        features: torch.Tensor,
        anchor_token: int,
        embed: torch.Tensor,
        head: torch.Tensor,
        size: int | None = None,
    ) -> tuple[torch.Tensor, list[int]]:
        """(logits [size−1, V] of slots 1..size−1 after the logit fields, the selector's greedy
        path through them) for a block of `size` slots (default B)."""
        hidden = self.hidden(features, anchor_token, embed, size or self.block_size)[1:]
        logits = self.transform(hidden @ head.T)
        selector = "candidate_selector."
        projected = hidden @ self.weights[selector + "hidden_projection.weight"].T  # [S, rank]
        before = self.weights[selector + "predecessor_codebook.weight"]
        after = self.weights[selector + "successor_codebook.weight"]
        path, previous = [], anchor_token
        for slot in range(hidden.shape[0]):
            values, ids = torch.topk(logits[slot], self.top_k)  # best logit first
            best_score, best_id = None, None
            for value, token in zip(values.tolist(), ids.tolist(), strict=True):
                score = value + float((before[previous] * projected[slot] * after[token]).sum())
                if best_score is None or score > best_score:  # a tie keeps the larger logit
                    best_score, best_id = score, token
            path.append(best_id)
            previous = best_id
        return logits, path
