"""Drafter configs: where each field is read from, what is refused, and how a config is
checked against the target. (How missing settings are filled, and from where, is the
provenance rules' business: tests/unit/harness/test_provenance.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from dflash_eval.contract.config_keys import TOP_LEVEL, UNDER_DFLASH_CONFIG
from dflash_eval.contract.errors import HarnessError
from dflash_eval.drafter.config import (
    DrafterConfig,
    LayerAttention,
    default_target_layer_ids,
    stated_settings,
    states_rope,
)
from dflash_eval.drafter.config import from_hf_dict as parse
from dflash_eval.drafter.dflash2_config import KEYS
from dflash_eval.drafter.fit import check_against_target, infer_from_shapes
from dflash_eval.target.config import TargetShape

from .helpers import small_config

TARGET = TargetShape(
    num_layers=6, hidden_size=64, vocab_size=101, rms_norm_eps=1e-6, rope_theta=10_000.0
)
BASE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def refused(raw: dict) -> str:
    with pytest.raises(HarnessError) as caught:
        parse(raw, "the test config")
    return str(caught.value)


def misfit(config: DrafterConfig) -> str:
    with pytest.raises(HarnessError) as caught:
        check_against_target(config, TARGET, "the test config")
    return str(caught.value)


# --- parsing --------------------------------------------------------------------------------


def test_a_published_config_round_trips():
    config = small_config(
        num_target_layers=6,
        vocab_size=101,
        layer_types=("sliding_attention", "full_attention"),
        sliding_window=8,
    )
    assert parse(config.to_hf_dict(), "x") == config


def test_defaults_of_a_bare_config():
    config = parse(BASE, "x")
    assert config.head_dim == 16 and config.target_layer_ids == ()
    assert (config.block_size, config.mask_token_id) == (0, -1)
    assert (config.rms_norm_eps, config.rope_theta, config.rope_type) == (1e-6, 10_000.0, "default")
    assert config.max_position_embeddings == 32768  # Qwen3Config's, as the reference gets
    assert config.layer_types is None and config.sliding_window is None
    assert config.num_target_layers is None and config.vocab_size is None


def test_dflash_fields_at_the_top_level_or_under_dflash_config():
    top = parse({**BASE, "target_layer_ids": [1, 3], "mask_token_id": 0, "block_size": 8}, "x")
    assert (top.target_layer_ids, top.mask_token_id, top.block_size) == ((1, 3), 0, 8)
    nested = {
        **BASE,
        "target_layer_ids": [9],
        "mask_token_id": 9,
        "dflash_config": {"target_layer_ids": [2, 4], "mask_token_id": 5, "block_size": 7},
    }
    inner = parse(nested, "x")  # dflash_config wins for ids and mask
    assert (inner.target_layer_ids, inner.mask_token_id, inner.block_size) == ((2, 4), 5, 7)
    assert parse({**BASE, "block_size": 7, "dflash_config": {"block_size": 7}}, "x").block_size == 7
    message = refused({**BASE, "block_size": 6, "dflash_config": {"block_size": 7}})
    assert "block_size 6 at the top level and 7 under dflash_config" in message


@pytest.mark.parametrize("key", ["draft_config", "model_config", "drafter_config"])
def test_a_config_nested_one_level_down_is_found(key):
    raw = {key: {**BASE, "head_dim": 8}, "dflash_config": {"target_layer_ids": [1]}, "lr": 1}
    config = parse(raw, "x")
    assert config.head_dim == 8 and config.target_layer_ids == (1,)
    # No hidden_size: not a config, so an unknown key of the config around it.
    assert f"does not know: {key}." in refused({key: {"lr": 1}, **BASE})


def test_rope_theta_from_any_of_its_places():
    assert parse({**BASE, "rope_theta": 5.0}, "x").rope_theta == 5.0
    assert parse({**BASE, "rope_parameters": {"rope_theta": 7.0}}, "x").rope_theta == 7.0
    scaling = {"rope_type": "default", "rope_theta": 9.0}
    assert parse({**BASE, "rope_scaling": scaling}, "x").rope_theta == 9.0
    assert parse({**BASE, "rms_norm_eps": 1e-5}, "x").rms_norm_eps == 1e-5


@pytest.mark.parametrize(
    ("layer_types", "said"),
    [
        (["sliding_attention"], "one entry per layer (num_hidden_layers 2), found 1 entries"),
        ("full_attention", "one entry per layer (num_hidden_layers 2), found 'full_attention'"),
        (["full_attention", "linear_attention"], "layer_types holds 'linear_attention'"),
    ],
)
def test_layer_types_are_read_by_our_rule_before_transformers(layer_types, said):
    message = refused({**BASE, "layer_types": layer_types, "sliding_window": 8})
    assert said in message and "the test config" in message and "\n" not in message


def test_missing_required_fields_are_listed():
    message = refused({"hidden_size": 64, "num_hidden_layers": 2})
    assert "lacks intermediate_size, num_attention_heads, num_key_value_heads" in message
    assert "the test config" in message and "--drafter-config" in message


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"attention_bias": True}, "attention_bias=true"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ],
)
def test_each_unsupported_feature_is_named(extra, named):
    message = refused({**BASE, **extra})
    assert f"does not implement: {named}." in message


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            {"dflash_config": {"conv_kernel_size": 4}},
            "conv_group_size, selector_rank, selector_top_k",
        ),
        (
            {"selector_rank": 8, "architectures": ["DFlash2DraftModel"]},
            "conv_kernel_size, conv_group_size, selector_top_k",
        ),
    ],
)
def test_a_partial_dflash2_config_names_the_missing_keys(extra, named):
    message = refused({**BASE, **extra})
    assert f"is a DFlash-2 config without {named}." in message


def test_a_dflash2_config_is_read_from_dflash_config_or_the_top_level():
    parts = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_top_k": 8}
    raw = {**BASE, "vocab_size": 100, "selector_rank": 4, "dflash_config": parts}
    config = parse(raw, "x")
    assert config.dflash2 is not None and config.dflash2.to_hf_dict() == {
        **parts,
        "selector_rank": 4,
    }
    assert config.to_hf_dict()["architectures"] == ["DFlash2DraftModel"]


def test_a_dflash2_config_as_published_passes_the_key_check_with_its_fields():
    """z-lab's published DFlash-2 config: sliding layers with is_causal false, the logit
    fields and the DFlash-2 keys under dflash_config; no accept_keys needed."""
    dflash = {
        "block_size": 16,
        "conv_kernel_size": 2,
        "conv_group_size": 16,
        "selector_rank": 8,
        "selector_top_k": 4,
        "output_multiplier": 0.2,
        "final_logit_softcapping": 20.0,
    }
    raw = {
        **BASE,
        "architectures": ["DFlash2DraftModel"],
        "vocab_size": 100,
        "is_causal": False,
        "layer_types": ["sliding_attention", "sliding_attention"],
        "use_sliding_window": True,
        "sliding_window": 8,
        "max_window_layers": 2,
        "dflash_config": dflash,
    }
    config = parse(raw, "x")
    assert config.dflash2 is not None and config.dflash2.selector_top_k == 4
    assert (config.output_multiplier, config.final_logit_softcapping) == (0.2, 20.0)
    assert config.accepted_keys == {}
    assert config.attention_record()[1] == {
        "kind": "sliding_attention",
        "causal": False,
        "window": 8,
    }
    assert parse(config.to_hf_dict(), "x") == config
    top = {**raw, "dflash_config": {"block_size": 16}, **{k: dflash[k] for k in KEYS}}
    assert parse(top, "x").dflash2 == config.dflash2  # the top level is read too


def test_features_at_their_neutral_values_are_accepted():
    neutral = {
        "attention_bias": False,
        "hidden_act": "silu",
        "input_embedding_scale": 1,
        "output_multiplier": 1.0,
        "final_logit_softcapping": None,
    }
    assert parse({**BASE, **neutral}, "x").hidden_size == 64


def test_the_embedding_and_logit_fields_are_read_where_the_reference_reads_them():
    assert parse(BASE, "x").input_embedding_scale == 1.0
    top = parse({**BASE, "input_embedding_scale": 2, "final_logit_softcapping": 30}, "x")
    assert (top.input_embedding_scale, top.final_logit_softcapping) == (2.0, 30.0)
    both = {**BASE, "output_multiplier": 3.0, "dflash_config": {"output_multiplier": 0.5}}
    assert parse(both, "x").output_multiplier == 0.5  # dflash_config first, as _draft_value
    config = small_config(output_multiplier=0.5, final_logit_softcapping=20.0)
    assert config.to_hf_dict()["dflash_config"]["output_multiplier"] == 0.5
    assert parse(config.to_hf_dict(), "x") == config
    message = refused({**BASE, "dflash_config": {"output_multiplier": "half"}})
    assert "output_multiplier='half'; expected a number" in message


def test_a_published_hf_config_with_its_bookkeeping_keys_is_accepted():
    published = {
        **BASE,
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "dtype": "bfloat16",
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "is_causal": False,
        "max_window_layers": 2,
        "model_type": "qwen3",
        "num_target_layers": 6,
        "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 8,
        "use_sliding_window": True,
        "tie_word_embeddings": False,
        "transformers_version": "5.15.0",
        "use_cache": False,
        "vocab_size": 101,
        "dflash_config": {"block_size": 16, "mask_token_id": 3, "target_layer_ids": [1, 3]},
    }
    config = parse(published, "x")
    assert config.layer_attention(0) == LayerAttention("sliding_attention", False, 8)
    assert config.accepted_keys == {}


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"draft_vocab_size": 32000}, "draft_vocab_size"),
        ({"dflash_config": {"is_causal": True}}, "dflash_config.is_causal"),
        ({"dflash_config": {"num_target_layers": 6}}, "dflash_config.num_target_layers"),
    ],
)
def test_an_unknown_key_stops_the_run_by_name_unless_the_profile_accepts_it(extra, named):
    message = refused({**BASE, **extra})
    assert f"does not know: {named}. " in message and '"accept_keys"' in message
    config = parse({**BASE, **extra}, "x", accept_keys=[named])
    assert named in config.accepted_keys
    assert parse(BASE, "x", accept_keys=[named]).accepted_keys == {}  # absent: nothing


def test_several_unsupported_features_are_named_together():
    message = refused({**BASE, "attention_bias": True, "hidden_act": "relu"})
    assert "attention_bias=true, hidden_act='relu'" in message


# --- layers ---------------------------------------------------------------------------------


def test_layer_attention_follows_the_current_reference():
    config = small_config(layer_types=("sliding_attention", "full_attention"), sliding_window=8)
    assert [config.layer_attention(i) for i in (0, 1)] == [
        LayerAttention("sliding_attention", causal=True, window=8),
        LayerAttention("full_attention", causal=False, window=None),
    ]
    assert small_config().layer_attention(1) == LayerAttention("full_attention", False, None)
    forced = small_config(is_causal=True).layer_attention(0)
    assert forced == LayerAttention("full_attention", True, None)
    assert config.attention_record()[0] == {
        "kind": "sliding_attention",
        "causal": True,
        "window": 8,
    }


def test_is_causal_must_be_a_boolean():
    assert parse({**BASE, "is_causal": False}, "x").is_causal is False
    assert "is_causal='no'; expected true, false or null" in refused({**BASE, "is_causal": "no"})


# --- checking against the target ------------------------------------------------------------


def test_a_config_that_fits_passes():
    check_against_target(small_config(target_layer_ids=(0, 5), mask_token_id=0), TARGET, "x")
    check_against_target(small_config(mask_token_id=100, num_target_layers=6), TARGET, "x")


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"hidden_size": 32}, "drafter hidden_size 32 != target hidden_size 64"),
        ({"target_layer_ids": (1, 6)}, "target_layer_ids [6] outside the target's 0..5"),
        ({"target_layer_ids": (-1, 3)}, "target_layer_ids [-1] outside the target's 0..5"),
        ({"num_target_layers": 8}, "trained for a 8-layer target, this target has 6 layers"),
        ({"mask_token_id": 101}, "mask_token_id 101 outside the target vocab (0..100)"),
        ({"mask_token_id": -1}, "mask_token_id -1 outside the target vocab"),
        ({"layer_types": ("full_attention",)}, "layer_types has 1 entries for 2 drafter layers"),
    ],
)
def test_each_misfit_alone_is_named(changes, problem):
    message = misfit(small_config(**changes))
    assert problem in message and message.count(";") == 0
    assert "Check that --target is the model the drafter was trained for" in message


def test_several_misfits_are_named_together():
    message = misfit(small_config(hidden_size=32, mask_token_id=500))
    assert "embedding and LM head); mask_token_id 500 outside" in message


# --- what a config states, defaults, and shapes ---------------------------------------------


def test_stated_settings_are_only_what_the_config_says():
    assert stated_settings(BASE) == {}
    nested = {"draft_config": {**BASE, "block_size": 6, "num_target_layers": 36}}
    assert stated_settings(nested) == {"block_size": 6, "num_target_layers": 36}
    flat = {**BASE, "dflash_config": {"target_layer_ids": [1, 3], "mask_token_id": 0}}
    assert stated_settings(flat) == {"target_layer_ids": (1, 3), "mask_token_id": 0}


def test_whether_a_config_states_its_rope():
    assert not states_rope(BASE)
    assert states_rope({**BASE, "rope_theta": 1e6})
    assert states_rope({"model_config": {**BASE, "rope_parameters": {"rope_theta": 5.0}}})


def test_the_defaults_are_qwen3s_and_configs_are_hashable():
    from transformers import Qwen3Config

    config = small_config()
    assert config.max_position_embeddings == Qwen3Config().max_position_embeddings
    assert config.rope_theta == Qwen3Config().rope_parameters["rope_theta"]
    assert len({small_config(), small_config()}) == 1  # usable as a key, equal → same hash


def test_the_reference_default_layer_rule():
    assert default_target_layer_ids(6, 1) == [3]
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(6, 2) == [1, 3]


def test_the_architecture_is_read_back_from_parameter_shapes():
    from dflash_eval.drafter.model import DFlashDrafter

    config = small_config(head_dim=8, intermediate_size=80, num_hidden_layers=3)
    shapes = {name: tuple(t.shape) for name, t in DFlashDrafter(config).state_dict().items()}
    inferred = infer_from_shapes(shapes, TARGET)
    assert (
        inferred.hidden_size,
        inferred.intermediate_size,
        inferred.num_hidden_layers,
        inferred.num_attention_heads,
        inferred.num_key_value_heads,
        inferred.head_dim,
    ) == (64, 80, 3, 4, 2, 8)
    assert inferred.rms_norm_eps == TARGET.rms_norm_eps
    # What shapes cannot tell stays unset for the provenance rules.
    assert (inferred.target_layer_ids, inferred.block_size, inferred.mask_token_id) == ((), 0, -1)
    del shapes["layers.0.mlp.gate_proj.weight"]
    with pytest.raises(HarnessError, match=r"'layers\.0\.mlp\.gate_proj\.weight' is absent"):
        infer_from_shapes(shapes, TARGET)


def test_every_accepted_key_is_in_the_specification():
    spec = (Path(__file__).parents[3] / "docs" / "harness-spec.md").read_text()
    missing = [key for key in [*TOP_LEVEL, *UNDER_DFLASH_CONFIG] if f"`{key}`" not in spec]
    assert missing == []
