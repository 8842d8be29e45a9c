"""The drafter's rotary tables are transformers' own, bit for bit, without its modeling modules.

RotaryTable computes the tables of the rope types fixed at construction itself (importing
transformers' modeling modules costs seconds of a cached run's start-up); these tests hold it
to `torch.equal` with transformers' Qwen3 / Qwen3-Next rotary embeddings for every rope type,
full and partial rotation, both activation dtypes, and positions from 0 to past a million.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dflash_eval.drafter.config import from_hf_dict
from dflash_eval.drafter.model import FIXED_ROPE_TYPES, RotaryTable
from transformers import Qwen3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.qwen3 import modeling_qwen3
from transformers.models.qwen3_next import modeling_qwen3_next

from .helpers import small_config
from .test_rope import ROPE_TYPES, random_rope

REMOTE = Path(__file__).resolve().parents[3] / "remote"
# Every rope position a drafter may meet: the first blocks, powers of two and their
# neighbours (where float32 positions stop being exact, from 2**24), far past any context.
POSITIONS = sorted(
    {*range(70), *(p + d for e in range(6, 25) for p in [2**e] for d in (-1, 0, 1))}
    | {40_000, 131_071, 1_000_003, 33_554_431, 100_000_000}
)
# The most max_position_embeddings may be: "dynamic" and "longrope" tables stop below it.
LIMIT = 2**24


def _rope_config(rope_type: str, partial: float, head_dim: int, seed: int) -> dict:
    rng = random.Random(seed)
    raw = small_config(head_dim=head_dim, num_attention_heads=4, hidden_size=64).to_hf_dict()
    raw["rope_theta"] = rng.choice([10_000.0, 1_000_000.0])
    raw["max_position_embeddings"] = LIMIT
    rope = random_rope(rope_type, partial, rng, int(head_dim * partial) // 2)
    if rope_type == "longrope":
        rope["original_max_position_embeddings"] = LIMIT
    raw["rope_scaling"] = rope
    return raw


def _transformers_tables(raw: dict, partial: float, positions: torch.Tensor, dtype: torch.dtype):
    """cos, sin [1, T, rotary_dim] from the module the reference builds for this config."""
    hf_config = Qwen3Config(**{k: v for k, v in raw.items() if v is not None})
    if partial == 1.0:
        module = modeling_qwen3.Qwen3RotaryEmbedding(hf_config)
    else:
        module = modeling_qwen3_next.Qwen3NextRotaryEmbedding(hf_config)
    return module(torch.empty(0, dtype=dtype), positions.reshape(1, -1))


def test_every_rope_type_transformers_offers_is_sorted_into_fixed_or_not():
    """A rope type a later transformers adds goes through its module (correct, slower) until
    someone checks that it is fixed at construction; this says when one appears."""
    assert set(ROPE_TYPES) == {"default", *ROPE_INIT_FUNCTIONS}
    assert set(FIXED_ROPE_TYPES) == set(ROPE_TYPES) - {"dynamic", "longrope"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("partial", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("rope_type", ROPE_TYPES)
def test_tables_equal_transformers_bit_for_bit(rope_type, partial, dtype):
    positions = torch.tensor(POSITIONS)
    if rope_type not in FIXED_ROPE_TYPES:
        positions = positions[positions < LIMIT]
    for seed, head_dim in enumerate([64, 128]):
        raw = _rope_config(rope_type, partial, head_dim, seed)
        config = from_hf_dict(raw, "test")
        assert (config.rope_type, config.partial_rotary_factor) == (rope_type, partial)
        cos, sin = RotaryTable(config)(positions, dtype)
        expected_cos, expected_sin = _transformers_tables(raw, partial, positions, dtype)
        assert cos.dtype == dtype and cos.shape == expected_cos.shape[1:]
        assert torch.equal(cos, expected_cos[0]) and torch.equal(sin, expected_sin[0])


def test_tables_of_a_block_grid_are_those_of_its_positions():
    """forward_blocks asks for positions [N, B] at once: each row is its positions' tables."""
    table = RotaryTable(from_hf_dict(_rope_config("yarn", 1.0, 64, seed=1), "test"))
    grid = torch.tensor([[5, 6, 7], [900, 901, 902], [70_000, 70_001, 70_002]])
    cos, sin = table(grid, torch.bfloat16)
    assert cos.shape == (3, 3, 64)
    for row, positions in enumerate(grid):
        row_cos, row_sin = table(positions, torch.bfloat16)
        assert torch.equal(cos[row], row_cos) and torch.equal(sin[row], row_sin)


# A fresh interpreter: which transformers modeling modules building and running each drafter
# newly imports, after its config is read (reading one imports a transformers config class,
# which itself imports transformers' modeling_auto for its docstrings: not ours to avoid).
PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from dflash_eval.drafter.config import from_hf_dict
from dflash_eval.drafter.model import DFlashDrafter

imported = []
for raw in json.loads(sys.argv[2]):
    config = from_hf_dict(raw, "probe")
    before = set(sys.modules)
    DFlashDrafter(config).rotary(torch.arange(40), torch.float32)
    imported.append(sorted(
        name for name in set(sys.modules) - before
        if name.startswith("transformers.models.") and ".modeling_" in name
    ))
print(json.dumps(imported))
"""


def test_only_rope_types_that_change_in_the_forward_import_transformers_modeling():
    """A default-rope drafter imports no modeling module; a "dynamic" one, built next in the
    same interpreter, shows that the probe sees such an import (transformers' own module)."""
    default = small_config().to_hf_dict()
    dynamic = {**default, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(REMOTE), json.dumps([default, dynamic])],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    by_default, by_dynamic = json.loads(result.stdout)
    assert by_default == []
    assert "transformers.models.qwen3.modeling_qwen3" in by_dynamic
