"""The drafter forward against an independent, plainly written reference (dflash-spec.md §2)."""

from __future__ import annotations

import math

import pytest
import torch
from dflash_eval.drafter.config import LayerAttention, from_hf_dict
from dflash_eval.walk.metrics import Span, ddtree_pop_order, walk_prompt
from dflash_eval.walk.predict import (
    BorrowedHead,
    PerBlockPredictor,
    Predictor,
    block_predictions,
    row_max,
)

from .helpers import random_drafter, small_config

VOCAB = 50


def reference_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def reference_rope(x: torch.Tensor, positions: list[int], theta: float) -> torch.Tensor:
    """Rotate (x[i], x[i + D/2]) pairs by position · theta^(-2i/D), as complex numbers."""
    half = x.shape[-1] // 2
    out = torch.empty_like(x)
    for row, position in enumerate(positions):
        for i in range(half):
            angle = position * theta ** (-2 * i / x.shape[-1])
            z = complex(float(x[row, i]), float(x[row, i + half])) * complex(
                math.cos(angle), math.sin(angle)
            )
            out[row, i], out[row, i + half] = z.real, z.imag
    return out


def reference_block_logits(model, features, tokens, anchor, block_size, embed, head, rope=None):
    """Logits [B-1, V] of the block anchored at `anchor`, written out step by step.

    `rope(x [T, D], positions)` rotates one head's queries or keys (default: plain RoPE
    with the config's theta); the mask is z-lab's current rule (07ebd93), see `hidden`."""
    config = model.config
    if rope is None:

        def rope(x, positions):
            return reference_rope(x, positions, config.rope_theta)

    state = {name: p.detach() for name, p in model.named_parameters()}
    eps = config.rms_norm_eps
    ctx = reference_rms(features[:anchor] @ state["fc.weight"].T, state["hidden_norm.weight"], eps)
    x = embed[[tokens[anchor]] + [config.mask_token_id] * (block_size - 1)]
    heads, kv_heads, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    for index in range(config.num_hidden_layers):
        p = lambda name, i=index: state[f"layers.{i}.{name}"]  # noqa: E731
        normed = reference_rms(x, p("input_layernorm.weight"), eps)
        both = torch.cat([ctx, normed])  # keys/values: context first, then the block
        key_positions = list(range(anchor + block_size))
        query_positions = key_positions[anchor:]
        q = (normed @ p("self_attn.q_proj.weight").T).view(block_size, heads, d)
        k = (both @ p("self_attn.k_proj.weight").T).view(len(both), kv_heads, d)
        v = (both @ p("self_attn.v_proj.weight").T).view(len(both), kv_heads, d)
        outputs = []
        for h in range(heads):
            g = h // (heads // kv_heads)  # GQA: consecutive query heads share a KV head
            qh = rope(reference_rms(q[:, h], p("self_attn.q_norm.weight"), eps), query_positions)
            kh = rope(reference_rms(k[:, g], p("self_attn.k_norm.weight"), eps), key_positions)
            scores = qh @ kh.T / math.sqrt(d)
            for qi, qp in enumerate(query_positions):
                for ki, kp in enumerate(key_positions):
                    if hidden(config, index, qp, kp):
                        scores[qi, ki] = float("-inf")
            outputs.append(torch.softmax(scores, dim=-1) @ v[:, g])
        x = x + torch.cat(outputs, dim=-1) @ p("self_attn.o_proj.weight").T
        normed = reference_rms(x, p("post_attention_layernorm.weight"), eps)
        gate = normed @ p("mlp.gate_proj.weight").T
        up = normed @ p("mlp.up_proj.weight").T
        x = x + (gate * torch.sigmoid(gate) * up) @ p("mlp.down_proj.weight").T
    return reference_rms(x, state["norm.weight"], eps)[1:] @ head.T


def hidden(config, layer: int, query: int, key: int) -> bool:
    """Whether `layer` hides key position `key` from query position `query`: causal unless
    is_causal says otherwise only for sliding layers; a causal layer hides what lies ahead,
    a window hides what lies `window` or more behind, and (not causal) as far ahead."""
    kind = config.layer_types[layer] if config.layer_types else "full_attention"
    causal = kind == "sliding_attention" if config.is_causal is None else config.is_causal
    window = config.sliding_window if kind == "sliding_attention" else None
    if causal and key > query:
        return True
    if window is not None and query - key >= window:
        return True
    return window is not None and not causal and key - query >= window


def _setup(layer_types=None, sliding_window=None, seed=0, is_causal=None):
    config = small_config(
        layer_types=layer_types, sliding_window=sliding_window, is_causal=is_causal
    )
    model = random_drafter(config, seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    length = 30
    tokens = torch.randint(4, VOCAB, (length,), generator=generator).tolist()
    features = torch.randn(length, 2 * config.hidden_size, generator=generator)
    embed = torch.randn(VOCAB, config.hidden_size, generator=generator)
    head = torch.randn(VOCAB, config.hidden_size, generator=generator)
    return config, model, tokens, features, embed, head


def _batched_logits(model, config, tokens, features, embed, head, anchors):
    cache = model.context_cache(model.fuse_context(features))
    anchor_tensor = torch.tensor(anchors)
    block = torch.full((len(anchors), config.block_size), config.mask_token_id)
    block[:, 0] = torch.tensor(tokens)[anchor_tensor]
    with torch.no_grad():
        hidden = model.forward_blocks(embed[block], anchor_tensor, cache)
    return hidden[:, 1:] @ head.T


def test_batched_forward_matches_plain_reference_with_gqa_and_sliding_window():
    config, model, tokens, features, embed, head = _setup(
        layer_types=("full_attention", "sliding_attention"), sliding_window=7
    )
    anchors = [3, 10, 17, 24]
    logits = _batched_logits(model, config, tokens, features, embed, head, anchors)
    for row, anchor in enumerate(anchors):
        expected = reference_block_logits(
            model, features, tokens, anchor, config.block_size, embed, head
        )
        torch.testing.assert_close(logits[row], expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    ("layer_types", "is_causal"),
    [
        (("sliding_attention", "sliding_attention"), False),  # slot 0 must not see slots 3..
        (("sliding_attention", "full_attention"), None),  # the reference default: causal
        (("full_attention", "sliding_attention"), True),  # a causal full layer
    ],
    ids=["not-causal-sliding", "default-causal-sliding", "causal-full"],
)
def test_a_window_narrower_than_the_block_under_each_rule(layer_types, is_causal):
    # Window 3 < block 6, and the context beyond 2 positions back stays hidden.
    config, model, tokens, features, embed, head = _setup(
        layer_types=layer_types, sliding_window=3, seed=11, is_causal=is_causal
    )
    anchors = [4, 13, 21]
    logits = _batched_logits(model, config, tokens, features, embed, head, anchors)
    for row, anchor in enumerate(anchors):
        expected = reference_block_logits(
            model, features, tokens, anchor, config.block_size, embed, head
        )
        torch.testing.assert_close(logits[row], expected, atol=2e-5, rtol=2e-5)
        block = embed[[tokens[anchor]] + [config.mask_token_id] * (config.block_size - 1)]
        with torch.no_grad():
            uncached = model.forward_uncached(model.fuse_context(features[:anchor]), block)
        torch.testing.assert_close(logits[row], uncached[1:] @ head.T, atol=5e-5, rtol=1e-5)


def test_sliding_window_rules_are_qwen3configs():
    base = small_config().to_hf_dict()
    # The reference reads configs as Qwen3Config, which drops the window unless
    # use_sliding_window is on: sliding_attention layers then keep only their causality.
    off = {**base, "layer_types": ["sliding_attention"] * 2, "sliding_window": 3}
    off["use_sliding_window"] = False
    assert from_hf_dict(off, "x").layer_attention(0) == LayerAttention(
        "sliding_attention", True, None
    )
    # Without layer_types, layers from max_window_layers on slide.
    derived = {**base, "use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1}
    del derived["layer_types"]
    config = from_hf_dict(derived, "x")
    assert [config.layer_attention(i).window for i in range(2)] == [None, 3]
    assert [config.layer_attention(i).causal for i in range(2)] == [False, True]
    assert from_hf_dict(config.to_hf_dict(), "x") == config
    told = from_hf_dict({**derived, "is_causal": False}, "x")
    assert [told.layer_attention(i).causal for i in range(2)] == [False, False]
    assert from_hf_dict(told.to_hf_dict(), "x") == told


def test_single_block_forward_matches_plain_reference():
    config, model, tokens, features, embed, head = _setup(seed=3)
    logits = _batched_logits(model, config, tokens, features, embed, head, [11])
    expected = reference_block_logits(model, features, tokens, 11, config.block_size, embed, head)
    torch.testing.assert_close(logits[0], expected, atol=2e-5, rtol=2e-5)


def test_cached_context_equals_uncached_computation():
    sliding = ("sliding_attention", "full_attention")
    for layer_types, window, causal in (
        (None, None, None),
        (sliding, 5, None),
        (sliding, 5, False),
    ):
        config, model, tokens, features, embed, head = _setup(layer_types, window, 5, causal)
        anchors = [2, 9, 15, 22, 28]
        cached = _batched_logits(model, config, tokens, features, embed, head, anchors)
        for row, anchor in enumerate(anchors):
            block = embed[[tokens[anchor]] + [config.mask_token_id] * (config.block_size - 1)]
            with torch.no_grad():
                ctx = model.fuse_context(features[:anchor])
                uncached = model.forward_uncached(ctx, block)[1:] @ head.T
            torch.testing.assert_close(cached[row], uncached, atol=5e-5, rtol=1e-5)


def test_batched_and_per_block_predictions_give_identical_metrics():
    config, model, tokens, features, embed, head = _setup(seed=7)
    borrowed = BorrowedHead(embed, head, config.mask_token_id)
    # Make acceptance non-trivial: the "completion" is the drafter's own first guesses.
    first = 5
    predictor = Predictor(model, borrowed, tokens, features, first, config.block_size, 4, chunk=8)
    for anchor in range(first, len(tokens) - 1, 3):
        guesses = predictor.draft(anchor)
        tokens[anchor + 1 : anchor + 3] = guesses[: len(tokens[anchor + 1 : anchor + 3])]
    batched = Predictor(model, borrowed, tokens, features, first, config.block_size, 4, chunk=8)
    per_block = PerBlockPredictor(
        model, borrowed, tokens, features, first, config.block_size, 4, chunk=1
    )
    span = Span(first, len(tokens))
    walk_batched = walk_prompt(batched, tokens, span, config.block_size, [2, 4])
    walk_single = walk_prompt(per_block, tokens, span, config.block_size, [2, 4])
    assert walk_batched == walk_single
    assert max(walk_batched.lengths) > 1
    for anchor in range(first, len(tokens) - 1):
        assert batched.draft(anchor) == per_block.draft(anchor)
        (batched_ids, batched_logprobs), (single_ids, single_logprobs) = (
            batched.tree(anchor),
            per_block.tree(anchor),
        )
        assert batched_ids == single_ids
        torch.testing.assert_close(
            torch.tensor(batched_logprobs), torch.tensor(single_logprobs), atol=1e-5, rtol=1e-5
        )


def test_tree_candidates_leave_out_only_slots_no_tree_can_reach():
    generator = torch.Generator().manual_seed(3)
    blocks, slots, width, top_k = 24, 7, 8, 6
    # Sharper blocks further down: flat ones keep slot 1 only, peaked ones go deep.
    sharpness = torch.linspace(0.2, 8, blocks)[:, None, None]
    hidden = torch.randn(blocks, slots + 1, width, generator=generator) * sharpness
    head = torch.randn(VOCAB, width, generator=generator)
    logits = hidden[:, 1:].reshape(-1, width) @ head.T
    predictions = block_predictions(logits.view(blocks, slots, -1), top_k)
    values, ids = torch.topk(logits, top_k, dim=-1)
    every_slot = (values - torch.logsumexp(logits, dim=-1, keepdim=True)).view(blocks, slots, -1)
    ids = ids.view(blocks, slots, -1)
    depths = []
    for block, prediction in enumerate(predictions):
        depth = len(prediction.tree_ids)
        depths.append(depth)
        assert prediction.draft == ids[block, :, 0].tolist()
        assert prediction.tree_ids == ids[block, :depth].tolist()
        torch.testing.assert_close(
            torch.tensor(prediction.tree_logprobs), every_slot[block, :depth]
        )
        for budget in range(1, top_k + 1):
            # The same tree (nodes and pop order) as with every slot's candidates.
            assert ddtree_pop_order(prediction.tree_logprobs, budget) == ddtree_pop_order(
                every_slot[block].tolist(), budget
            )
    assert min(depths) == 1 and max(depths) == slots and len(set(depths)) > 3, depths


def test_row_max_matches_torch_max_ties_included():
    generator = torch.Generator().manual_seed(4)
    for columns in (4096, 50):  # grouped, and the plain fallback
        values = torch.randint(0, 6, (200, columns), generator=generator).float()  # many ties
        values[0] = 5.0  # every column ties: the first one wins
        values[1, 100 % columns :] = 7.0  # the first maximum sits mid-way into a group
        best, index = row_max(values)
        expected_best, expected_index = values.max(dim=-1)
        assert torch.equal(best, expected_best) and torch.equal(index, expected_index)
        assert index[0] == 0 and index[1] == 100 % columns
