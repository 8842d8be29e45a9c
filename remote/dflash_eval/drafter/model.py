"""The DFlash drafter (dflash-spec.md §1–2), in the order data flows: RMSNorm → rotary →
attention → MLP → layer → drafter.

A reader who knows Hugging Face's `modeling_qwen3.py` should recognise every piece. Where
DFlash differs from Qwen3:
- keys/values come from the fused target context *and* the block (context first), queries
  from the block only;
- the mask is z-lab's current one (`dflash/model.py` at commit 07ebd93db9f4, `_attention_mask`):
  a layer is causal when the config's `is_causal` says so, else when it is a
  `sliding_attention` layer. With query position i and key position j (absolute), a causal
  layer sees j ≤ i; a sliding window w also needs i − j < w, and on a non-causal layer
  j − i < w too; a non-causal full layer sees its whole context and its whole block
  (`config.LayerAttention`, `visibility` below). Before 07ebd93 every layer was non-causal;
  results of schema 2 were computed that way;
- the drafter owns no embedding and no LM head (the caller passes the target's).

Batching: `DFlashDrafter.forward_blocks` evaluates N blocks anchored at different positions
of one sequence in one pass. The N blocks are laid out as one query sequence, the keys are
[context; block 0; block 1; …], and a block-structured mask lets block n see context
positions < s_n and its own block only, narrowed by each layer's rule. The context K/V of
each layer is computed once per sequence (`context_cache`) and shared by every block.

RoPE follows the reference (every rope type transformers implements; a `partial_rotary_factor`
below 1 rotates the leading dimensions only, as the Qwen3-family models that support it do).
The inverse frequencies come from transformers' own init functions and the tables are
computed as its Qwen3 rotary embedding computes them, bit for bit, without importing
transformers' modeling modules (start-up time that a cached run needs for nothing else); the
rope types whose tables change in the forward ("dynamic", "longrope") use its module itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dflash_eval.contract.errors import HarnessError
from dflash_eval.drafter.config import (
    DrafterConfig,
    LayerAttention,
    qwen3_config,
    rope_config_values,
)


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


# cos/sin tables [..., rotary_dim] for a set of positions, in the activations' dtype.
Rope = tuple[torch.Tensor, torch.Tensor]


class RotaryTable:
    """The drafter config's rotary tables, equal bit for bit to transformers' rotary embedding
    (the reference's).

    Deliberately not an nn.Module: its inverse frequencies stay float32 whatever the
    drafter's dtype, and a meta-device build of the drafter leaves them intact; they move to
    the device of the positions asked for.
    """

    def __init__(self, config: DrafterConfig) -> None:
        values = rope_config_values(config, config.rope_parameters())
        hf_config = qwen3_config(values, "the drafter config")
        self.rope_type = config.rope_type
        self.length_limit = _length_limit(config)
        self.module: nn.Module | None = None
        with torch.device("cpu"):
            if self.rope_type in FIXED_ROPE_TYPES:
                self.inv_freq, self.attention_scaling = _inverse_frequencies(hf_config)
            else:
                self.module = _transformers_rotary(hf_config, config.partial_rotary_factor)

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """Absolute positions [...] → cos, sin [..., rotary_dim]."""
        if self.length_limit is not None and int(positions.max()) >= self.length_limit:
            raise HarnessError(
                f"RoPE type {self.rope_type!r} changes its tables past position "
                f"{self.length_limit}, and this sequence reaches {int(positions.max())}: the "
                "cached evaluation would not match the live loop. Use shorter prompts or "
                "--max-new-tokens."
            )
        flat = positions.reshape(1, -1)  # the [batch, T] transformers is called with
        if self.module is None:
            self.inv_freq = self.inv_freq.to(flat.device)  # the drafter on CUDA: tables follow
            cos, sin = _tables(self.inv_freq, self.attention_scaling, flat, dtype)  # [1, T, D]
        else:
            self.module.to(flat.device)
            cos, sin = self.module(torch.empty(0, dtype=dtype, device=flat.device), flat)
        shape = (*positions.shape, cos.shape[-1])
        return cos.reshape(shape), sin.reshape(shape)


# Rope types whose inverse frequencies transformers fixes at construction. The others
# ("dynamic", "longrope", any type a later transformers adds) may recompute them in the
# forward (its `dynamic_rope_update`), so they keep transformers' module.
FIXED_ROPE_TYPES = ("default", "linear", "yarn", "llama3", "proportional")


def _inverse_frequencies(hf_config) -> tuple[torch.Tensor, float]:
    """inv_freq [rotary_dim / 2] (float32) and the tables' scale, as transformers' rotary
    embedding computes them at construction. "default" is not in ROPE_INIT_FUNCTIONS:
    each model's rotary class has its own; Qwen3-Next's (which Qwen3's equals at a factor
    of 1) keeps the first head_dim·partial_rotary_factor dimensions."""
    parameters = hf_config.rope_parameters
    if parameters["rope_type"] != "default":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        return ROPE_INIT_FUNCTIONS[parameters["rope_type"]](hf_config)
    base = parameters["rope_theta"]
    head_dim = getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // hf_config.num_attention_heads
    )
    dim = int(head_dim * parameters.get("partial_rotary_factor", 1.0))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0


def _tables(
    inv_freq: torch.Tensor, attention_scaling: float, positions: torch.Tensor, dtype: torch.dtype
) -> Rope:
    """Qwen3RotaryEmbedding.forward, operation for operation (any reordering or fusing could
    move a bit): float32 angles, each frequency twice, cos/sin scaled, then the cast."""
    freqs = positions[..., None].float() * inv_freq.to(positions.device, torch.float)  # [1, T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [1, T, D]
    cos = emb.cos() * attention_scaling
    sin = emb.sin() * attention_scaling
    return cos.to(dtype), sin.to(dtype)


def _length_limit(config: DrafterConfig) -> int | None:
    """First position from which the rope type's tables depend on the longest position in a
    call ("dynamic" grows past max_position_embeddings, "longrope" switches factors past the
    original length). The live loop and the cached evaluation call with different lengths,
    so they agree only below it."""
    if config.rope_type == "dynamic":
        return config.max_position_embeddings
    if config.rope_type == "longrope":
        return int(config.rope_scaling["original_max_position_embeddings"])
    return None


def _transformers_rotary(hf_config, partial_rotary_factor: float) -> nn.Module:
    """Qwen3's rotary embedding (the reference's); for a partial rotary factor, the Qwen3-
    family one that honours it (Qwen3-Next: same maths, first head_dim·factor dimensions).
    Only the rope types outside FIXED_ROPE_TYPES pay for importing it."""
    if partial_rotary_factor == 1.0:
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        return Qwen3RotaryEmbedding(hf_config)
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRotaryEmbedding

    return Qwen3NextRotaryEmbedding(hf_config)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first cos.shape[-1] dimensions of x; the rest pass through unchanged."""
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat([rotated * cos + rotate_half(rotated) * sin, passed], dim=-1)


class DFlashAttention(nn.Module):
    """Qwen3 attention (GQA, per-head q/k RMSNorm before RoPE) over [context; block]."""

    def __init__(self, config: DrafterConfig, layer_index: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.attention = config.layer_attention(layer_index)
        hidden, q_size = config.hidden_size, self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(hidden, q_size, bias=False)
        self.k_proj = nn.Linear(hidden, kv_size, bias=False)
        self.v_proj = nn.Linear(hidden, kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, hidden, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def _keys_values(self, x: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., T, H] with its rope tables [..., T, R] → k, v [..., kv_heads, T, D]."""
        shape = (*x.shape[:-1], self.num_kv_heads, self.head_dim)
        k = self.k_norm(self.k_proj(x).view(shape)).transpose(-2, -3)  # [..., kv, T, D]
        v = self.v_proj(x).view(shape).transpose(-2, -3)  # no norm on V
        cos, sin = rope
        return apply_rotary(k, cos.unsqueeze(-3), sin.unsqueeze(-3)), v

    def _queries(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        """x [..., T, H] → q [..., heads, T, D]."""
        shape = (*x.shape[:-1], self.num_heads, self.head_dim)
        q = self.q_norm(self.q_proj(x).view(shape)).transpose(-2, -3)
        cos, sin = rope
        return apply_rotary(q, cos.unsqueeze(-3), sin.unsqueeze(-3))

    def context_kv(self, ctx: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused context [S, H] at positions 0..S-1 → k, v [kv_heads, S, D] (cacheable)."""
        return self._keys_values(ctx, rope)

    def forward(
        self,
        x: torch.Tensor,
        rope: Rope,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Blocks x [N, B, H] (already input-normed) with the rope tables of their positions
        [N, B, R] → [N, B, H].

        ctx_k/ctx_v [kv, S, D] are the cached context K/V. mask [N·B, S+N·B] (additive:
        0 = may attend, -inf = hidden) is required when N > 1; with N = 1 and no mask every
        key is visible.
        """
        blocks, block_size, _ = x.shape
        q = self._queries(x, rope)  # [N, heads, B, D]
        k, v = self._keys_values(x, rope)  # [N, kv, B, D]
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

    def forward_uncached(self, x: torch.Tensor, ctx: torch.Tensor, rope: Rope) -> torch.Tensor:
        """One block x [B, H] anchored at s = len(ctx), computing K/V from [ctx; x] as
        written in dflash-spec.md §2.4 (no cache); rope holds the tables of positions 0..s+B-1.
        Used to check the cached path."""
        start, block_size = ctx.shape[0], x.shape[0]
        k, v = self._keys_values(torch.cat([ctx, x], dim=0), rope)  # [kv, S+B, D]
        q = self._queries(x, (rope[0][start:], rope[1][start:]))  # [heads, B, D]
        all_positions = torch.arange(start + block_size)
        mask = visibility(all_positions[start:], all_positions, self.attention)
        out = F.scaled_dot_product_attention(
            q[None], k[None], v[None], attn_mask=mask, enable_gqa=True
        )  # [1, heads, B, D]
        return self.o_proj(out[0].transpose(0, 1).reshape(block_size, -1))


def visibility(
    query_positions: torch.Tensor, key_positions: torch.Tensor, attention: LayerAttention
) -> torch.Tensor | None:
    """[Q, K] True where a query may attend to a key, by the layer's rule (LayerAttention);
    None when the rule hides nothing."""
    if not attention.masked:
        return None
    ahead = key_positions[None, :] - query_positions[:, None]  # j − i
    visible = torch.ones(ahead.shape, dtype=torch.bool)
    if attention.causal:
        visible &= ahead <= 0
    if attention.window is not None:
        visible &= -ahead < attention.window
        if not attention.causal:
            visible &= ahead < attention.window
    return visible


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
    """Pre-norm decoder layer; the context bypasses the layer norms (dflash-spec.md §2.4)."""

    def __init__(self, config: DrafterConfig, layer_index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DFlashMLP(config)

    def forward(
        self,
        x: torch.Tensor,
        rope: Rope,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_uncached(self, x: torch.Tensor, ctx: torch.Tensor, rope: Rope) -> torch.Tensor:
        x = x + self.self_attn.forward_uncached(self.input_layernorm(x), ctx, rope)
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
    layer_class: type[DFlashLayer] = DFlashLayer  # DFlash-2 layers: model_dflash2.py

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        num_features = len(config.target_layer_ids) * config.hidden_size
        self.fc = nn.Linear(num_features, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(
            self.layer_class(config, index) for index in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryTable(config)  # shared by every layer, as the reference's

    def fuse_context(self, features: torch.Tensor) -> torch.Tensor:
        """Concatenated target hidden states [S, K·H] → fused context [S, H]."""
        return self.hidden_norm(self.fc(features))

    def context_cache(self, ctx: torch.Tensor) -> ContextCache:
        """K/V of the fused context for every layer, computed once per sequence."""
        rope = self.rotary(torch.arange(ctx.shape[0]), ctx.dtype)
        pairs = [layer.self_attn.context_kv(ctx, rope) for layer in self.layers]
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
        rope = self.rotary(positions, block_embeds.dtype)
        x = block_embeds
        for index, layer in enumerate(self.layers):
            x = layer(
                x,
                rope,
                cache.keys[index][:, :context_length],
                cache.values[index][:, :context_length],
                masks[layer.self_attn.attention],
            )
        return self.norm(x)

    def _block_masks(
        self,
        anchors: torch.Tensor,
        positions: torch.Tensor,
        context_length: int,
        dtype: torch.dtype,
    ) -> dict[LayerAttention, torch.Tensor | None]:
        """One mask [N·B, S+N·B] per distinct attention rule among the layers."""
        blocks, block_size = positions.shape
        rules = {layer.self_attn.attention for layer in self.layers}
        if blocks == 1 and not any(rule.masked for rule in rules):
            return dict.fromkeys(rules)  # a single block sees everything it is given
        query_positions = positions.reshape(-1)  # [N·B]
        query_block = torch.arange(blocks).repeat_interleave(block_size)  # [N·B]
        context = torch.arange(context_length)
        sees_context = context[None, :] < anchors[query_block][:, None]  # [N·B, S]
        sees_block = query_block[:, None] == query_block[None, :]  # [N·B, N·B]
        structure = torch.cat([sees_context, sees_block], dim=1)
        key_positions = torch.cat([context, query_positions])
        masks: dict[LayerAttention, torch.Tensor | None] = {}
        for rule in rules:
            limit = visibility(query_positions, key_positions, rule)
            visible = structure if limit is None else structure & limit
            # Additive form, built once and shared by every layer (SDPA would otherwise
            # convert a boolean mask in each layer).
            masks[rule] = torch.zeros(visible.shape, dtype=dtype).masked_fill_(
                ~visible, float("-inf")
            )
        return masks

    def embed_block(self, embed_weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Block token ids [...] → input embeddings [..., H]: rows of the target's embedding
        times the config's input_embedding_scale (the reference's raw embedding lookup)."""
        embeds = embed_weight[ids]
        scale = self.config.input_embedding_scale
        return embeds if scale == 1.0 else embeds * scale

    def logits(self, hidden: torch.Tensor, head_weight: torch.Tensor) -> torch.Tensor:
        """Final hidden [..., H] → float32 logits [..., V] through the target's LM head, then
        transformed (`transform_logits`, in float32, after the head)."""
        flat = hidden.reshape(-1, hidden.shape[-1])  # one GEMM over all rows is the fastest
        logits = F.linear(flat, head_weight).float().view(*hidden.shape[:-1], -1)
        return self.transform_logits(logits)

    def transform_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Head logits [..., V] times output_multiplier, then softcapped by
        final_logit_softcapping when it is > 0 (the reference's `compute_logits`), in the
        dtype they come in."""
        if self.config.output_multiplier != 1.0:
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        if cap is not None and cap > 0:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def forward_uncached(self, ctx: torch.Tensor, block_embed: torch.Tensor) -> torch.Tensor:
        """One block [B, H] anchored at s = len(ctx) (fused context [s, H]), recomputing
        the context K/V in every layer → final-normed hidden states [B, H]."""
        rope = self.rotary(torch.arange(ctx.shape[0] + block_embed.shape[0]), block_embed.dtype)
        x = block_embed
        for layer in self.layers:
            x = layer.forward_uncached(x, ctx, rope)
        return self.norm(x)


def build_drafter(
    config: DrafterConfig, dtype: torch.dtype, model_class: type[DFlashDrafter] = DFlashDrafter
) -> DFlashDrafter:
    """An uninitialised drafter (no random init cost); the caller loads the weights."""
    with torch.device("meta"):
        model = model_class(config)
    return model.to_empty(device="cpu").to(dtype).eval()
