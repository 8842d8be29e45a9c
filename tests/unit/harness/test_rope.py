"""RoPE as transformers does it: every rope type, partial rotary, on random small configs.

The reference here rotates with transformers' own rotary embedding and apply function
(Qwen3's, and Qwen3-Next's where a partial rotary factor needs it); the rest of the
drafter forward is the plain reference of test_model.py.
"""

from __future__ import annotations

import random

import pytest
import torch
from dflash_eval.contract.errors import HarnessError
from dflash_eval.drafter.config import from_hf_dict
from transformers import Qwen3Config
from transformers.models.qwen3 import modeling_qwen3
from transformers.models.qwen3_next import modeling_qwen3_next

from .helpers import random_drafter, small_config
from .test_model import VOCAB, reference_block_logits

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional")


def random_rope(rope_type: str, partial: float, rng: random.Random, rotary_pairs: int) -> dict:
    """A random rope_scaling dict of this type (small original lengths, so the scaled
    frequency ranges fall inside the positions the test uses)."""
    original = rng.choice([8, 16, 24])
    extra: dict = {
        "default": {},
        "linear": {"factor": rng.uniform(1.5, 6)},
        "dynamic": {"factor": rng.uniform(1.5, 6)},
        "yarn": {
            "factor": rng.uniform(2, 8),
            "original_max_position_embeddings": original,
            "beta_fast": rng.choice([8.0, 32.0]),
            "beta_slow": 1.0,
        },
        "llama3": {
            "factor": rng.uniform(2, 8),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original,
        },
        "longrope": {
            "short_factor": [rng.uniform(1, 2) for _ in range(rotary_pairs)],
            "long_factor": [rng.uniform(2, 4) for _ in range(rotary_pairs)],
            "original_max_position_embeddings": 64,  # above the positions used: short factors
        },
        "proportional": {},
    }[rope_type]
    rope = {"rope_type": rope_type, **extra}
    if partial != 1.0:
        rope["partial_rotary_factor"] = partial
    return rope


def _config(rope_type: str, partial: float, seed: int):
    rng = random.Random(seed)
    head_dim = rng.choice([16, 32])
    config = small_config(
        head_dim=head_dim, num_attention_heads=4, hidden_size=64, block_size=rng.choice([4, 6])
    )
    raw = config.to_hf_dict()
    raw["rope_theta"] = rng.choice([500.0, 10_000.0, 1_000_000.0])
    raw["max_position_embeddings"] = 48
    rotary_pairs = int(head_dim * partial) // 2
    raw["rope_scaling"] = random_rope(rope_type, partial, rng, rotary_pairs)
    return raw, from_hf_dict(raw, "test")


def transformers_rope(raw: dict, partial: float):
    """rope(x [T, D], positions) with transformers' rotary embedding and apply function."""
    hf_config = Qwen3Config(**{k: v for k, v in raw.items() if v is not None})
    if partial == 1.0:
        module = modeling_qwen3.Qwen3RotaryEmbedding(hf_config)
        apply = modeling_qwen3.apply_rotary_pos_emb
    else:
        module = modeling_qwen3_next.Qwen3NextRotaryEmbedding(hf_config)
        apply = modeling_qwen3_next.apply_rotary_pos_emb

    def rope(x: torch.Tensor, positions: list[int]) -> torch.Tensor:
        cos, sin = module(x[None], torch.tensor([positions]))  # [1, T, rotary_dim]
        rotated, _ = apply(x[None, None], x[None, None], cos, sin)
        return rotated[0, 0]

    return rope


def _inputs(config, seed: int):
    generator = torch.Generator().manual_seed(seed)
    length = 36
    tokens = torch.randint(4, VOCAB, (length,), generator=generator).tolist()
    features = torch.randn(length, 2 * config.hidden_size, generator=generator)
    embed = torch.randn(VOCAB, config.hidden_size, generator=generator)
    head = torch.randn(VOCAB, config.hidden_size, generator=generator)
    return tokens, features, embed, head


def _block_logits(model, config, tokens, features, embed, anchors):
    cache = model.context_cache(model.fuse_context(features))
    anchor_tensor = torch.tensor(anchors)
    block = torch.full((len(anchors), config.block_size), config.mask_token_id)
    block[:, 0] = torch.tensor(tokens)[anchor_tensor]
    with torch.no_grad():
        return model.forward_blocks(embed[block], anchor_tensor, cache)


@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("rope_type", ROPE_TYPES)
def test_drafter_rope_matches_transformers(rope_type, partial):
    for seed in range(2):
        raw, config = _config(rope_type, partial, seed)
        assert config.rope_type == rope_type and config.partial_rotary_factor == partial
        model = random_drafter(config, seed=seed)
        tokens, features, embed, head = _inputs(config, seed)
        anchors = [3, 17, 29]
        hidden = _block_logits(model, config, tokens, features, embed, anchors)
        rope = transformers_rope(raw, partial)
        for row, anchor in enumerate(anchors):
            expected = reference_block_logits(
                model, features, tokens, anchor, config.block_size, embed, head, rope=rope
            )
            torch.testing.assert_close(hidden[row, 1:] @ head.T, expected, atol=5e-5, rtol=5e-5)


def test_scaled_rope_changes_the_drafts():
    """The rope settings reach the model (a config's yarn is not read as plain RoPE)."""
    raw, yarn = _config("yarn", 1.0, seed=3)
    plain = from_hf_dict({**raw, "rope_scaling": None}, "test")
    assert plain.rope_type == "default" and plain.rope_theta == yarn.rope_theta
    tokens, features, embed, _ = _inputs(yarn, 3)
    scaled = _block_logits(random_drafter(yarn, seed=1), yarn, tokens, features, embed, [30])
    unscaled = _block_logits(random_drafter(plain, seed=1), plain, tokens, features, embed, [30])
    assert (scaled - unscaled).abs().max() > 1e-3


def test_config_round_trips_with_scaled_rope():
    for rope_type in ROPE_TYPES:
        _, config = _config(rope_type, 0.5, seed=5)
        assert from_hf_dict(config.to_hf_dict(), "again") == config


def test_length_dependent_rope_past_its_limit_is_refused():
    """dynamic/longrope tables depend on the longest position of a call, which differs
    between the live loop and the cached evaluation past the limit."""
    raw, config = _config("dynamic", 1.0, seed=0)
    config = from_hf_dict({**raw, "max_position_embeddings": 20}, "test")
    model = random_drafter(config)
    tokens, features, embed, _ = _inputs(config, 0)
    with pytest.raises(HarnessError, match="changes its tables past position 20"):
        _block_logits(model, config, tokens, features, embed, [5])


def test_invalid_rope_parameters_are_explained():
    raw = small_config().to_hf_dict()
    with pytest.raises(HarnessError, match="transformers rejects"):
        from_hf_dict({**raw, "rope_scaling": {"rope_type": "yarn"}}, "cfg.json")  # no factor
    with pytest.raises(HarnessError, match="does not implement"):
        from_hf_dict({**raw, "rope_scaling": {"rope_type": "made-up"}}, "cfg.json")
