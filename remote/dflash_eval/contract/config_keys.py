"""Every drafter config key the harness accepts, with what it means for the evaluation.

A config key the harness does not know could change the drafter's maths without the harness
noticing (z-lab's code has grown `is_causal`, logit multipliers and DFlash-2 parts this way),
so a key outside these lists stops the run by name, at the top level or under
`dflash_config`, unless the drafter profile lists it under `accept_keys` ("KEY" for the top
level, "dflash_config.KEY" below it). Accepted keys are recorded with the results.

The lists follow z-lab's current `dflash/model.py` (commit 07ebd93db9f4): what it reads from a
config (transformers' Qwen3Config and `_draft_value`), plus the bookkeeping keys Hugging Face
writes into every config.json, which change nothing in the maths. The numeric ones have
bounds (CONFIG_BOUNDS), checked by dflash_eval.contract.numbers before anything is built from them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dflash_eval.contract.errors import HarnessError

BOOKKEEPING = "bookkeeping, not read by the maths"

# The numbers of a drafter config, (minimum, maximum, whole): far beyond any real model,
# yet small enough that nothing built from them (a list per layer, a table per position)
# can exhaust the host. Checked before transformers or the harness allocates anything.
LIMIT = 1 << 24
CONFIG_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "hidden_size": (1, 1 << 16, True),
    "intermediate_size": (1, 1 << 20, True),
    "num_hidden_layers": (1, 1024, True),
    "num_attention_heads": (1, 1024, True),
    "num_key_value_heads": (1, 1024, True),
    "head_dim": (1, 4096, True),
    "vocab_size": (1, LIMIT, True),
    "max_position_embeddings": (1, LIMIT, True),
    "sliding_window": (1, LIMIT, True),
    "max_window_layers": (0, 1024, True),
    "block_size": (0, 1024, True),  # 0: unset (DrafterConfig.to_hf_dict writes it so)
    "num_target_layers": (1, 1024, True),
    "mask_token_id": (-1, LIMIT, True),  # -1: unset, as block_size's 0
    "rms_norm_eps": (0, 1, False),
    "rope_theta": (0, 1e12, False),
    "partial_rotary_factor": (0, 1, False),
    "conv_kernel_size": (1, 1024, True),
    "conv_group_size": (1, 1 << 16, True),
    "selector_rank": (1, 1 << 16, True),
    "selector_top_k": (1, LIMIT, True),
}

TOP_LEVEL: dict[str, str] = {
    # The Qwen3 architecture.
    "hidden_size": "width of the drafter (must equal the target's)",
    "intermediate_size": "MLP width",
    "num_hidden_layers": "drafter layers",
    "num_attention_heads": "query heads",
    "num_key_value_heads": "key/value heads (GQA)",
    "head_dim": "per-head width (default hidden_size / heads)",
    "rms_norm_eps": "RMSNorm epsilon",
    "hidden_act": "MLP activation (only silu is implemented; others are refused)",
    "attention_bias": "projection biases (only false is implemented; true is refused)",
    "attention_dropout": "dropout in training; no effect on evaluation",
    "max_position_embeddings": "positions the RoPE type is scaled for",
    "vocab_size": "the target vocabulary the drafter was built for (checked against it)",
    # RoPE, read through transformers' Qwen3Config as the reference reads it.
    "rope_theta": "RoPE base",
    "rope_scaling": "RoPE type and its parameters (transformers 4.x name)",
    "rope_parameters": "RoPE type and its parameters (transformers 5.x name)",
    "partial_rotary_factor": "share of each head's dimensions that RoPE rotates",
    # Attention masks (dflash-spec.md §2.4).
    "layer_types": "per layer: full_attention or sliding_attention",
    "use_sliding_window": "Qwen3Config: false drops the window of sliding layers",
    "sliding_window": "window of sliding_attention layers",
    "max_window_layers": "Qwen3Config: layers from this index slide when layer_types is absent",
    "is_causal": "true/false for every layer; absent: sliding layers causal, full layers not",
    # DFlash.
    "dflash_config": "the DFlash settings below",
    "block_size": "slots per drafted block (anchor included)",
    "num_target_layers": "layers of the target the drafter was trained for",
    "target_layer_ids": "target layers whose hidden states are the context",
    "mask_token_id": "token whose target embedding fills the unknown slots",
    "input_embedding_scale": "multiplies the block's input embeddings",
    "output_multiplier": "multiplies the drafter's logits",
    "final_logit_softcapping": "c > 0: logits become tanh(logits / c) · c",
    # DFlash-2 (drafter/dflash2_config.py, docs/dflash2.md), read under dflash_config first.
    "conv_kernel_size": "DFlash-2: taps of each layer's causal convolutions",
    "conv_group_size": "DFlash-2: channels sharing one dynamic convolution weight",
    "selector_rank": "DFlash-2: width of the candidate selector's codes",
    "selector_top_k": "DFlash-2: candidates per slot the selector scores",
    # What Hugging Face writes into every config.json.
    "_name_or_path": BOOKKEEPING,
    "architectures": "the class that loads it: DFlash2DraftModel makes a DFlash-2 drafter, "
    "any other is bookkeeping",
    "auto_map": BOOKKEEPING + " (remote-code class names)",
    "model_type": BOOKKEEPING,
    "torch_dtype": BOOKKEEPING + " (the stored dtype; the evaluation dtype is --dtype)",
    "dtype": BOOKKEEPING + " (the stored dtype; the evaluation dtype is --dtype)",
    "transformers_version": BOOKKEEPING,
    "bos_token_id": BOOKKEEPING + " (the tokenizer's)",
    "eos_token_id": BOOKKEEPING + " (the tokenizer's; stop tokens come from the target)",
    "pad_token_id": BOOKKEEPING + " (the tokenizer's)",
    "tie_word_embeddings": BOOKKEEPING + " (the drafter borrows the target's embedding and head)",
    "initializer_range": BOOKKEEPING + " (weight initialisation in training)",
    "use_cache": BOOKKEEPING + " (a runtime switch)",
}

UNDER_DFLASH_CONFIG: dict[str, str] = {
    "block_size": TOP_LEVEL["block_size"],
    "target_layer_ids": TOP_LEVEL["target_layer_ids"],
    "mask_token_id": TOP_LEVEL["mask_token_id"],
    "input_embedding_scale": TOP_LEVEL["input_embedding_scale"],
    "output_multiplier": TOP_LEVEL["output_multiplier"],
    "final_logit_softcapping": TOP_LEVEL["final_logit_softcapping"],
    "conv_kernel_size": TOP_LEVEL["conv_kernel_size"],
    "conv_group_size": TOP_LEVEL["conv_group_size"],
    "selector_rank": TOP_LEVEL["selector_rank"],
    "selector_top_k": TOP_LEVEL["selector_top_k"],
}

PREFIX = "dflash_config."


def accepted_unknown_keys(
    raw: Mapping[str, Any], accepted: Iterable[str], where: str
) -> dict[str, Any]:
    """The keys outside the lists that `accepted` (the profile's accept_keys) lets through,
    with their values; any other one stops the run, named."""
    dflash = raw.get("dflash_config") or {}
    unknown = {key: raw[key] for key in raw if key not in TOP_LEVEL}
    unknown |= {PREFIX + key: dflash[key] for key in dflash if key not in UNDER_DFLASH_CONFIG}
    refused = sorted(set(unknown) - set(accepted))
    if refused:
        raise HarnessError(
            f"The drafter config from {where} has keys whose meaning this harness does not "
            f"know: {', '.join(refused)}. A key it ignored could change the drafter's maths "
            "unseen, so the run stops. If the key changes nothing in evaluation, list it under "
            '"accept_keys" in the drafter profile (keys under dflash_config as '
            '"dflash_config.KEY"); otherwise this harness cannot evaluate the drafter.'
        )
    return unknown
