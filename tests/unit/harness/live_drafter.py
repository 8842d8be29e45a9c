"""A DFlash drafter computed plainly, for the live loops (live_loops.py) to check the harness.

`PlainDrafter` is the DFlash forward written out from the drafter's config.json dict and its
weights, as z-lab's `dflash/model.py` at 07ebd93 computes it, with the mask built position by
position from the rule as the reference states it (`sees`). Nothing is imported from
dflash_eval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, positions: list[int], theta: float) -> torch.Tensor:
    """Plain RoPE on x [T, heads, D]: pairs (i, i + D/2) turned by position · theta^(-2i/D)."""
    half = x.shape[-1] // 2
    frequencies = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angles = torch.tensor(positions, dtype=torch.float64)[:, None] * frequencies  # [T, D/2]
    cos, sin = angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


@dataclass
class PlainDrafter:
    """A DFlash drafter (plain RoPE only) from its config dict and weights, computed as
    z-lab's `dflash/model.py` at 07ebd93 does."""

    config: dict[str, Any]  # the drafter's config.json
    weights: dict[str, torch.Tensor]  # unprefixed parameter names

    def value(self, name: str, default: Any = None) -> Any:
        """dflash_config first, then the top level (the reference's `_draft_value`)."""
        return (self.config.get("dflash_config") or {}).get(name, self.config.get(name, default))

    @property
    def block_size(self) -> int:
        return int(self.value("block_size"))

    @property
    def mask_token_id(self) -> int:
        return int(self.value("mask_token_id"))

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.value("target_layer_ids"))

    def sees(self, layer: int, query: int, key: int) -> bool:
        """Whether a query at absolute position `query` attends to the key at `key`."""
        layer_types = self.config.get("layer_types") or []
        sliding = bool(layer_types) and layer_types[layer] == "sliding_attention"
        stated = self.config.get("is_causal")
        causal = sliding if stated is None else bool(stated)
        # Qwen3Config keeps the window only when use_sliding_window is on.
        window = (
            self.config.get("sliding_window") if self.config.get("use_sliding_window") else None
        )
        if not sliding:
            window = None
        if causal and key > query:
            return False
        if window is not None and query - key >= window:
            return False
        return not (window is not None and not causal and key - query >= window)

    @torch.no_grad()
    def logits(
        self, features: torch.Tensor, block_ids: list[int], embed: torch.Tensor, head: torch.Tensor
    ) -> torch.Tensor:
        """Target features of positions 0..s-1 [s, K·H] and a block [g[s], MASK…] → the
        drafted slots' logits [len(block)-1, V]."""
        w, c = self.weights, self.config
        eps = float(c.get("rms_norm_eps", 1e-6))
        theta = float(c.get("rope_theta") or (c.get("rope_parameters") or {})["rope_theta"])
        heads, kv_heads = int(c["num_attention_heads"]), int(c["num_key_value_heads"])
        d = int(c.get("head_dim") or c["hidden_size"] // heads)
        ctx = rms(features @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
        start, size = ctx.shape[0], len(block_ids)
        x = embed[block_ids] * float(self.value("input_embedding_scale", 1.0))
        keys, queries = list(range(start + size)), list(range(start, start + size))
        for layer in range(int(c["num_hidden_layers"])):
            p = {
                n[len(f"layers.{layer}.") :]: t
                for n, t in w.items()
                if n.startswith(f"layers.{layer}.")
            }
            normed = rms(x, p["input_layernorm.weight"], eps)
            both = torch.cat([ctx, normed])  # context first, then the block
            q = rms(
                (normed @ p["self_attn.q_proj.weight"].T).view(size, heads, d),
                p["self_attn.q_norm.weight"],
                eps,
            )
            k = rms(
                (both @ p["self_attn.k_proj.weight"].T).view(len(keys), kv_heads, d),
                p["self_attn.k_norm.weight"],
                eps,
            )
            v = (both @ p["self_attn.v_proj.weight"].T).view(len(keys), kv_heads, d)
            q, k = _rotate(q, queries, theta), _rotate(k, keys, theta)
            k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
            allowed = torch.tensor([[self.sees(layer, i, j) for j in keys] for i in queries])
            scores = scores.masked_fill(~allowed, float("-inf"))
            out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)
            x = x + out.reshape(size, heads * d) @ p["self_attn.o_proj.weight"].T
            normed = rms(x, p["post_attention_layernorm.weight"], eps)
            gate, up = normed @ p["mlp.gate_proj.weight"].T, normed @ p["mlp.up_proj.weight"].T
            x = x + (gate * torch.sigmoid(gate) * up) @ p["mlp.down_proj.weight"].T
        return self.transform(rms(x, w["norm.weight"], eps)[1:] @ head.T)

    def transform(self, logits: torch.Tensor) -> torch.Tensor:
        """Head logits times output_multiplier, then softcapped when the cap is > 0."""
        logits = logits * float(self.value("output_multiplier", 1.0))
        cap = self.value("final_logit_softcapping")
        if cap is not None and float(cap) > 0:
            logits = torch.tanh(logits / float(cap)) * float(cap)
        return logits
