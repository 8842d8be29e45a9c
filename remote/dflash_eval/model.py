"""The DFlash drafter (DFLASH.md §1–2), in the order data flows: RMSNorm → rotary →
attention → MLP → layer → drafter.

A reader who knows Hugging Face's `modeling_qwen3.py` should recognise every piece. Where
DFlash differs from Qwen3:
- keys/values come from the fused target context *and* the block (context first), queries
  from the block only;
- there is no causal mask: each block slot sees its whole context and its whole block;
- the drafter owns no embedding and no LM head (the caller passes the target's).

Batching: `DFlashDrafter.forward_blocks` evaluates N blocks anchored at different positions
of one sequence in one pass. The N blocks are laid out as one query sequence, the keys are
[context; block 0; block 1; …], and a block-structured mask lets block n see context
positions < s_n and its own block only. The context K/V of each layer is computed once per
sequence (`context_cache`) and shared by every block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dflash_eval.config import DrafterConfig


class RMSNorm(nn.Module):
    """Qwen3RMSNorm: normalise in fp32, scale in the input dtype."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(input_dtype)


def rotary_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for absolute positions: [..., head_dim] (computed in fp32, as HF)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)  # [D/2]
    freqs = positions.float()[..., None] * inv_freq  # [..., D/2]
    angles = torch.cat([freqs, freqs], dim=-1)  # [..., D]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


class DFlashAttention(nn.Module):
    """Qwen3 attention (GQA, per-head q/k RMSNorm before RoPE) over [context; block]."""

    def __init__(self, config: DrafterConfig, layer_index: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta
        self.window = config.layer_window(layer_index)
        hidden, q_size = config.hidden_size, self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(hidden, q_size, bias=False)
        self.k_proj = nn.Linear(hidden, kv_size, bias=False)
        self.v_proj = nn.Linear(hidden, kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, hidden, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def _keys_values(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., T, H] at absolute positions [..., T] → k, v [..., kv_heads, T, D]."""
        shape = (*x.shape[:-1], self.num_kv_heads, self.head_dim)
        k = self.k_norm(self.k_proj(x).view(shape)).transpose(-2, -3)  # [..., kv, T, D]
        v = self.v_proj(x).view(shape).transpose(-2, -3)  # no norm on V
        cos, sin = rotary_cos_sin(positions, self.head_dim, self.rope_theta, x.dtype)
        return apply_rotary(k, cos.unsqueeze(-3), sin.unsqueeze(-3)), v

    def _queries(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [..., T, H] → q [..., heads, T, D]."""
        shape = (*x.shape[:-1], self.num_heads, self.head_dim)
        q = self.q_norm(self.q_proj(x).view(shape)).transpose(-2, -3)
        cos, sin = rotary_cos_sin(positions, self.head_dim, self.rope_theta, x.dtype)
        return apply_rotary(q, cos.unsqueeze(-3), sin.unsqueeze(-3))

    def context_kv(self, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused context [S, H] at positions 0..S-1 → k, v [kv_heads, S, D] (cacheable)."""
        return self._keys_values(ctx, torch.arange(ctx.shape[0]))

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Blocks x [N, B, H] (already input-normed) at positions [N, B] → [N, B, H].

        ctx_k/ctx_v [kv, S, D] are the cached context K/V. mask [N·B, S+N·B] (additive:
        0 = may attend, -inf = hidden) is required when N > 1; with N = 1 and no mask every
        key is visible.
        """
        blocks, block_size, _ = x.shape
        q = self._queries(x, positions)  # [N, heads, B, D]
        k, v = self._keys_values(x, positions)  # [N, kv, B, D]
        kv, d = self.num_kv_heads, self.head_dim
        # All blocks as one sequence: queries [1, heads, N·B, D], keys [1, kv, S+N·B, D].
        q = q.transpose(0, 1).reshape(1, self.num_heads, blocks * block_size, d)
        k = torch.cat([ctx_k, k.transpose(0, 1).reshape(kv, blocks * block_size, d)], dim=1)
        v = torch.cat([ctx_v, v.transpose(0, 1).reshape(kv, blocks * block_size, d)], dim=1)
        out = F.scaled_dot_product_attention(
            q, k[None], v[None], attn_mask=mask, enable_gqa=True
        )  # [1, heads, N·B, D]
        out = out[0].reshape(self.num_heads, blocks, block_size, d).permute(1, 2, 0, 3)
        return self.o_proj(out.reshape(blocks, block_size, self.num_heads * d))

    def forward_uncached(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """One block x [B, H] anchored at s = len(ctx), computing K/V from [ctx; x] as
        written in DFLASH.md §2.4 (no cache). Used to check the cached path."""
        start, block_size = ctx.shape[0], x.shape[0]
        all_positions = torch.arange(start + block_size)
        k, v = self._keys_values(torch.cat([ctx, x], dim=0), all_positions)  # [kv, S+B, D]
        q = self._queries(x, all_positions[start:])  # [heads, B, D]
        mask = window_mask(all_positions[start:], all_positions, self.window)
        out = F.scaled_dot_product_attention(
            q[None], k[None], v[None], attn_mask=mask, enable_gqa=True
        )  # [1, heads, B, D]
        return self.o_proj(out[0].transpose(0, 1).reshape(block_size, -1))


def window_mask(
    query_positions: torch.Tensor, key_positions: torch.Tensor, window: int | None
) -> torch.Tensor | None:
    """Sliding window: a query sees keys less than `window` positions behind it (and the
    rest of its block ahead of it). None when there is no window."""
    if window is None:
        return None
    return (query_positions[:, None] - key_positions[None, :]) < window


class DFlashMLP(nn.Module):
    """Qwen3 SwiGLU MLP."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    """Pre-norm decoder layer; the context bypasses the layer norms (DFLASH.md §2.4)."""

    def __init__(self, config: DrafterConfig, layer_index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DFlashMLP(config)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_uncached(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn.forward_uncached(self.input_layernorm(x), ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class ContextCache:
    """Per-layer context K/V [kv_heads, S, D] of one sequence, positions 0..S-1."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        return self.keys[0].shape[1]


class DFlashDrafter(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        num_features = len(config.target_layer_ids) * config.hidden_size
        self.fc = nn.Linear(num_features, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(
            DFlashLayer(config, index) for index in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def fuse_context(self, features: torch.Tensor) -> torch.Tensor:
        """Concatenated target hidden states [S, K·H] → fused context [S, H]."""
        return self.hidden_norm(self.fc(features))

    def context_cache(self, ctx: torch.Tensor) -> ContextCache:
        """K/V of the fused context for every layer, computed once per sequence."""
        pairs = [layer.self_attn.context_kv(ctx) for layer in self.layers]
        return ContextCache([k for k, _ in pairs], [v for _, v in pairs])

    def forward_blocks(
        self, block_embeds: torch.Tensor, anchors: torch.Tensor, cache: ContextCache
    ) -> torch.Tensor:
        """N blocks [N, B, H] (embeddings of [g[s], MASK…]) anchored at positions
        anchors [N] → final-normed hidden states [N, B, H].

        Block n sees context positions 0..anchors[n]-1 and its own B slots.
        """
        block_size = block_embeds.shape[1]
        context_length = int(anchors.max())  # later context positions are never visible
        positions = anchors[:, None] + torch.arange(block_size)  # [N, B]
        masks = self._block_masks(anchors, positions, context_length, block_embeds.dtype)
        x = block_embeds
        for index, layer in enumerate(self.layers):
            x = layer(
                x,
                positions,
                cache.keys[index][:, :context_length],
                cache.values[index][:, :context_length],
                masks[layer.self_attn.window],
            )
        return self.norm(x)

    def _block_masks(
        self,
        anchors: torch.Tensor,
        positions: torch.Tensor,
        context_length: int,
        dtype: torch.dtype,
    ) -> dict[int | None, torch.Tensor | None]:
        """One mask [N·B, S+N·B] per distinct window among the layers (None = full)."""
        blocks, block_size = positions.shape
        windows = {layer.self_attn.window for layer in self.layers}
        if blocks == 1 and windows == {None}:
            return {None: None}  # a single block sees everything it is given
        query_positions = positions.reshape(-1)  # [N·B]
        query_block = torch.arange(blocks).repeat_interleave(block_size)  # [N·B]
        context = torch.arange(context_length)
        sees_context = context[None, :] < anchors[query_block][:, None]  # [N·B, S]
        sees_block = query_block[:, None] == query_block[None, :]  # [N·B, N·B]
        structure = torch.cat([sees_context, sees_block], dim=1)
        key_positions = torch.cat([context, query_positions])
        masks: dict[int | None, torch.Tensor | None] = {}
        for window in windows:
            limit = window_mask(query_positions, key_positions, window)
            visible = structure if limit is None else structure & limit
            # Additive form, built once and shared by every layer (SDPA would otherwise
            # convert a boolean mask in each layer).
            masks[window] = torch.zeros(visible.shape, dtype=dtype).masked_fill_(
                ~visible, float("-inf")
            )
        return masks

    def forward_uncached(self, ctx: torch.Tensor, block_embed: torch.Tensor) -> torch.Tensor:
        """One block [B, H] anchored at s = len(ctx) (fused context [s, H]), recomputing
        the context K/V in every layer → final-normed hidden states [B, H]."""
        x = block_embed
        for layer in self.layers:
            x = layer.forward_uncached(x, ctx)
        return self.norm(x)


def expected_shapes(config: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter name (unprefixed, as stored) with its shape."""
    with torch.device("meta"):
        model = DFlashDrafter(config)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def build_drafter(config: DrafterConfig, dtype: torch.dtype) -> DFlashDrafter:
    """An uninitialised drafter (no random init cost); the caller loads the weights."""
    with torch.device("meta"):
        model = DFlashDrafter(config)
    return model.to_empty(device="cpu").to(dtype).eval()
