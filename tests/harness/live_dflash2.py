"""A DFlash-2 drafter computed plainly, for the live loop (live_loops.py) to check the harness.

Written from reading z-lab's `DFlash2DraftModel` (dflash/model.py, commit 07ebd93), not from
the harness: one block at a time, every sum written out, nothing imported from dflash_eval.
It reads the drafter from its config.json dict and its parameters under the module names
(after the renames the reference's `from_pretrained` applies). Only full, non-causal
attention layers are supported; the tests' drafters have no others.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


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


class PlainDFlash2:
    def __init__(self, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        layer_types = config.get("layer_types") or ["full_attention"]
        if config.get("is_causal") or set(layer_types) != {"full_attention"}:
            raise ValueError("PlainDFlash2 computes full, non-causal attention layers only")
        self.raw, self.w = config, weights
        extra = config.get("dflash_config", {})

        def value(name: str) -> Any:  # the reference reads dflash_config first
            return extra.get(name, config.get(name))

        self.config = SimpleNamespace(
            block_size=value("block_size"),
            mask_token_id=value("mask_token_id"),
            target_layer_ids=value("target_layer_ids"),
        )
        self.top_k, self.kernel = value("selector_top_k"), value("conv_kernel_size")
        self.eps = config["rms_norm_eps"]
        self.rotary = Qwen3RotaryEmbedding(Qwen3Config(**config))

    def hidden(
        self, features: torch.Tensor, anchor_token: int, embed: torch.Tensor
    ) -> torch.Tensor:
        """Final-normed hidden states [B, H] of the block [anchor, MASK…] after the context
        features [S, K·H] of positions 0..S−1."""
        w, eps = self.w, self.eps
        ctx = _rms(features @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
        block = [anchor_token] + [self.config.mask_token_id] * (self.config.block_size - 1)
        x = embed[block]
        positions = torch.arange(ctx.shape[0] + x.shape[0])[None]
        cos, sin = (t[0] for t in self.rotary(x, positions))  # [S+B, head_dim]
        for i in range(self.raw["num_hidden_layers"]):
            p = f"layers.{i}."
            h = _rms(x, w[p + "input_layernorm.weight"], eps)
            h, after = self._conv_before(h, p + "attention_conv.")
            h = self._attention(h, ctx, p + "self_attn.", cos, sin)
            x = x + _convolve(h, w[p + "attention_conv.base_kernel"][1], after)
            h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
            h, after = self._conv_before(h, p + "mlp_conv.")
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            h = (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
            x = x + _convolve(h, w[p + "mlp_conv.base_kernel"][1], after)
        return _rms(x, self.w["norm.weight"], eps)

    def _conv_before(self, h: torch.Tensor, p: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The convolution before a sub-layer, and the dynamic weights of the one after it
        (both projected from the normed input h)."""
        projected = h @ self.w[p + "kernel_projection.weight"].T  # [T, 2·K·G]
        dynamic = projected.view(h.shape[0], 2, self.kernel, -1)
        return _convolve(h, self.w[p + "base_kernel"][0], dynamic[:, 0]), dynamic[:, 1]

    def _attention(
        self, h: torch.Tensor, ctx: torch.Tensor, p: str, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """Queries from the block; keys and values from [context; block]; no mask."""
        w, head_dim = self.w, self.raw["head_dim"]
        heads, kv_heads = self.raw["num_attention_heads"], self.raw["num_key_value_heads"]
        both = torch.cat([ctx, h])
        q = (h @ w[p + "q_proj.weight"].T).view(h.shape[0], heads, head_dim)
        k = (both @ w[p + "k_proj.weight"].T).view(both.shape[0], kv_heads, head_dim)
        v = (both @ w[p + "v_proj.weight"].T).view(both.shape[0], kv_heads, head_dim)
        q = _rms(q, w[p + "q_norm.weight"], self.eps)
        k = _rms(k, w[p + "k_norm.weight"], self.eps)
        q = _rotate(q, cos[-h.shape[0] :, None], sin[-h.shape[0] :, None])
        k = _rotate(k, cos[:, None], sin[:, None])
        out = torch.zeros_like(q)
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = q[:, head] @ k[:, kv].T / math.sqrt(head_dim)  # [B, S+B]
            out[:, head] = torch.softmax(scores, dim=-1) @ v[:, kv]
        return out.reshape(h.shape[0], -1) @ w[p + "o_proj.weight"].T

    def draft(
        self, features: torch.Tensor, anchor_token: int, embed: torch.Tensor, head: torch.Tensor
    ) -> tuple[torch.Tensor, list[int]]:
        """(logits [B−1, V] of slots 1..B−1, the selector's greedy path through them)."""
        hidden = self.hidden(features, anchor_token, embed)[1:]
        logits = hidden @ head.T
        selector = "candidate_selector."
        projected = hidden @ self.w[selector + "hidden_projection.weight"].T  # [B−1, rank]
        before = self.w[selector + "predecessor_codebook.weight"]
        after = self.w[selector + "successor_codebook.weight"]
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
