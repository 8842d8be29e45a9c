"""Drafter configuration (DFLASH.md §1): parsing, the default target-layer rule, inference.

A drafter config is a Qwen3 config plus `block_size`, `num_target_layers` and
`dflash_config.{target_layer_ids, mask_token_id}`. Anything the harness cannot honour
(biases, other activations, scaled RoPE, logit multipliers) is refused here, loudly, rather
than silently evaluated with the wrong maths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dflash_eval.errors import HarnessError


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_layer_ids: tuple[int, ...]
    block_size: int
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    # Per drafter layer: "full_attention" or "sliding_attention" (None: all full).
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    num_target_layers: int | None = None
    vocab_size: int | None = None

    def layer_window(self, layer_index: int) -> int | None:
        """Sliding window of one drafter layer, None for full attention."""
        if self.layer_types is None or self.layer_types[layer_index] != "sliding_attention":
            return None
        return self.sliding_window

    def to_hf_dict(self) -> dict[str, Any]:
        """The config as a Hugging Face DFlash config.json (what z-lab publishes)."""
        config: dict[str, Any] = {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "attention_bias": False,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "vocab_size": self.vocab_size,
            "dflash_config": {
                "target_layer_ids": list(self.target_layer_ids),
                "mask_token_id": self.mask_token_id,
            },
        }
        if self.layer_types is not None:
            config["layer_types"] = list(self.layer_types)
            config["sliding_window"] = self.sliding_window
        return config


def default_target_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """The reference rule: one layer → the middle; else spread over 1..L-3."""
    if count == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (count - 1)) for i in range(count)]


_REQUIRED = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)


def from_hf_dict(raw: Mapping[str, Any], where: str) -> DrafterConfig:
    """Parse a DFlash config dict (config.json, or the `config` of a training checkpoint).

    `where` names the source in error messages. `block_size`, `mask_token_id` and
    `target_layer_ids` may sit at the top level or under `dflash_config`. A missing
    `block_size`/`mask_token_id`/`target_layer_ids` is filled in by `complete()`.
    """
    # Training scripts sometimes nest the model config one level down.
    for key in ("draft_config", "model_config", "drafter_config"):
        if isinstance(raw.get(key), Mapping) and "hidden_size" in raw[key]:
            raw = {**raw[key], **{k: v for k, v in raw.items() if k == "dflash_config"}}
    dflash = dict(raw.get("dflash_config") or {})
    missing = [name for name in _REQUIRED if name not in raw]
    if missing:
        raise HarnessError(
            f"The drafter config from {where} lacks {', '.join(missing)}. Expected a Qwen3-style "
            "DFlash config (hidden_size, intermediate_size, num_hidden_layers, heads...). "
            "Pass a complete one with --drafter-config FILE."
        )
    _refuse_unsupported(raw, dflash, where)
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_theta = raw.get("rope_theta", rope.get("rope_theta", 1_000_000.0))
    layer_types = raw.get("layer_types")
    layer_ids = dflash.get("target_layer_ids", raw.get("target_layer_ids"))
    mask_id = dflash.get("mask_token_id", raw.get("mask_token_id"))
    block_size = raw.get("block_size", dflash.get("block_size"))
    return DrafterConfig(
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_hidden_layers=int(raw["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(raw["num_key_value_heads"]),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        target_layer_ids=tuple(int(i) for i in layer_ids) if layer_ids is not None else (),
        block_size=int(block_size) if block_size is not None else 0,
        mask_token_id=int(mask_id) if mask_id is not None else -1,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope_theta),
        layer_types=tuple(layer_types) if layer_types else None,
        sliding_window=int(raw["sliding_window"]) if raw.get("sliding_window") else None,
        num_target_layers=int(raw["num_target_layers"]) if raw.get("num_target_layers") else None,
        vocab_size=int(raw["vocab_size"]) if raw.get("vocab_size") else None,
    )


def _refuse_unsupported(raw: Mapping[str, Any], dflash: Mapping[str, Any], where: str) -> None:
    problems = []
    if raw.get("attention_bias"):
        problems.append("attention_bias=true")
    if raw.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={raw.get('hidden_act')!r}")
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        problems.append(f"rope_type={rope.get('rope_type', rope.get('type'))!r}")
    if float(rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
        problems.append("partial_rotary_factor != 1")
    for name in ("input_embedding_scale", "output_multiplier"):
        value = dflash.get(name, raw.get(name))
        if value not in (None, 1, 1.0):
            problems.append(f"{name}={value!r}")
    softcap = dflash.get("final_logit_softcapping", raw.get("final_logit_softcapping"))
    if softcap:
        problems.append(f"final_logit_softcapping={softcap!r}")
    for name in ("conv_kernel_size", "selector_rank"):
        if name in dflash or name in raw:
            problems.append(f"{name} (a DFlash-2 drafter)")
    if problems:
        raise HarnessError(
            f"The drafter config from {where} uses features this harness does not implement: "
            f"{', '.join(problems)}. Evaluating it with plain DFlash maths would give wrong "
            "numbers, so the run stops. Use a plain DFlash (Qwen3-style) drafter, or extend "
            "remote/dflash_eval/model.py first."
        )


@dataclass(frozen=True)
class TargetShape:
    """What the drafter config must agree with, read from the target's text config."""

    num_layers: int
    hidden_size: int
    vocab_size: int  # rows of the target's embedding matrix
    rms_norm_eps: float
    rope_theta: float


def complete(
    config: DrafterConfig,
    target: TargetShape,
    *,
    block_size: int | None,
    mask_token_id: int | None,
    target_layer_ids: list[int] | None,
    where: str,
    layer_count_hint: int | None = None,
) -> tuple[DrafterConfig, list[str]]:
    """Fill fields the source lacks from CLI values or the default rule; check against the
    target. Returns the config and notes to print (what was filled in, from where).

    `layer_count_hint` is K read from fc.weight's shape, used by the default rule when the
    source has no target_layer_ids (else the rule takes one target layer per drafter layer).
    """
    notes = []
    if target_layer_ids is not None:
        config = replace(config, target_layer_ids=tuple(target_layer_ids))
        notes.append(f"target_layer_ids {target_layer_ids} from --target-layer-ids")
    elif not config.target_layer_ids:
        # The reference code takes one target layer per drafter layer.
        count = layer_count_hint or config.num_hidden_layers
        ids = default_target_layer_ids(target.num_layers, count)
        config = replace(config, target_layer_ids=tuple(ids))
        notes.append(f"target_layer_ids {ids} from the default rule (L={target.num_layers})")
    if mask_token_id is not None:
        config = replace(config, mask_token_id=mask_token_id)
        notes.append(f"mask_token_id {mask_token_id} from --mask-token-id")
    if config.mask_token_id < 0:
        raise HarnessError(
            f"The drafter config from {where} has no mask_token_id (dflash_config.mask_token_id): "
            "the token whose embedding fills the unknown block slots. Pass --mask-token-id ID "
            "(the id the drafter was trained with) or a complete --drafter-config."
        )
    if block_size is not None:
        config = replace(config, block_size=block_size)
    if config.block_size <= 1:
        raise HarnessError(
            f"The drafter config from {where} has no block_size. Pass --block-size N with the "
            "block size the drafter was trained with (usually 16)."
        )
    if config.num_target_layers is None:
        config = replace(config, num_target_layers=target.num_layers)
    check_against_target(config, target, where)
    return config, notes


def check_against_target(config: DrafterConfig, target: TargetShape, where: str) -> None:
    """Mismatches that would load but cannot be right stop the run."""
    problems = []
    if config.hidden_size != target.hidden_size:
        problems.append(
            f"drafter hidden_size {config.hidden_size} != target hidden_size "
            f"{target.hidden_size} (the drafter borrows the target's embedding and LM head)"
        )
    bad_ids = [i for i in config.target_layer_ids if not 0 <= i < target.num_layers]
    if bad_ids:
        problems.append(
            f"target_layer_ids {bad_ids} outside the target's 0..{target.num_layers - 1}"
        )
    if config.num_target_layers not in (None, target.num_layers):
        problems.append(
            f"the drafter was trained for a {config.num_target_layers}-layer target, "
            f"this target has {target.num_layers} layers"
        )
    if not 0 <= config.mask_token_id < target.vocab_size:
        problems.append(
            f"mask_token_id {config.mask_token_id} outside the target vocab "
            f"(0..{target.vocab_size - 1})"
        )
    if config.layer_types is not None and len(config.layer_types) != config.num_hidden_layers:
        problems.append(
            f"layer_types has {len(config.layer_types)} entries for "
            f"{config.num_hidden_layers} drafter layers"
        )
    if (
        config.layer_types
        and "sliding_attention" in config.layer_types
        and not config.sliding_window
    ):
        problems.append("sliding_attention layers but no sliding_window")
    if problems:
        raise HarnessError(
            f"The drafter (config from {where}) does not fit this target: "
            + "; ".join(problems)
            + ". Check that --target is the model the drafter was trained for, and that the "
            "drafter config is the one it was trained with."
        )


def infer_from_shapes(shapes: Mapping[str, tuple[int, ...]], target: TargetShape) -> DrafterConfig:
    """Rebuild a config from parameter shapes plus the target config (last resort).

    block_size and mask_token_id cannot be read from shapes; `complete()` requires them.
    """
    try:
        hidden, fc_in = shapes["fc.weight"]
        head_dim = shapes["layers.0.self_attn.q_norm.weight"][0]
        q_out = shapes["layers.0.self_attn.q_proj.weight"][0]
        kv_out = shapes["layers.0.self_attn.k_proj.weight"][0]
        intermediate = shapes["layers.0.mlp.gate_proj.weight"][0]
    except KeyError as missing:
        raise HarnessError(
            f"Cannot infer the drafter config from the parameter shapes: {missing} is absent. "
            "Pass --drafter-config FILE with the drafter's config.json."
        ) from None
    layer_indices = {int(name.split(".")[1]) for name in shapes if name.startswith("layers.")}
    return DrafterConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=len(layer_indices),
        num_attention_heads=q_out // head_dim,
        num_key_value_heads=kv_out // head_dim,
        head_dim=head_dim,
        # K is whatever fc takes; the ids themselves come from the default rule.
        target_layer_ids=tuple(default_target_layer_ids(target.num_layers, fc_in // hidden))
        if fc_in % hidden == 0
        else (),
        block_size=0,
        mask_token_id=-1,
        rms_norm_eps=target.rms_norm_eps,
        rope_theta=target.rope_theta,
        num_target_layers=target.num_layers,
    )
