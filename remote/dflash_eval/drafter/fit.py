"""A drafter config against what it meets: the target it runs on (`check_against_target`:
what would load but cannot be right) and, when no config exists at all, the parameter shapes
it is rebuilt from (`infer_from_shapes`)."""

from __future__ import annotations

from collections.abc import Mapping

from dflash_eval.contract.errors import HarnessError
from dflash_eval.drafter.config import DrafterConfig
from dflash_eval.target.config import TargetShape


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
    if problems:
        raise HarnessError(
            f"The drafter (config from {where}) does not fit this target: "
            + "; ".join(problems)
            + ". Check that --target is the model the drafter was trained for, and that the "
            "drafter config is the one it was trained with."
        )


def infer_from_shapes(shapes: Mapping[str, tuple[int, ...]], target: TargetShape) -> DrafterConfig:
    """Rebuild the architecture from parameter shapes (last resort, when no config exists).

    Nothing else can be read from shapes: block size, mask id, target layer ids and RoPE
    are left unset for the provenance rules to take from other sources or refuse.
    """
    try:
        hidden, _ = shapes["fc.weight"]
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
        target_layer_ids=(),
        block_size=0,
        mask_token_id=-1,
        rms_norm_eps=target.rms_norm_eps,
    )
