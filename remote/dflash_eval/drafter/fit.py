"""A drafter against what it meets, checked before anything is built (the run and its dry run
check alike, so this imports no torch):

- the target: `check_against_target` (what would load but cannot be right),
  `check_fits_target` (a DFlash-2 selector's vocabulary), `require_context` (a prompt, its
  completion and a block past it within the target's positions);
- its weights: `check_parameters`, the names and shapes the config implies
  (`parameter_shapes`: the modules of model.py and model_dflash2.py) against the checkpoint's,
  after the reference's DFlash-2 renames (`reference_key_mapping`);
- and, when no config exists at all, the config rebuilt from the shapes (`infer_from_shapes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.weights import BORROWED
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


def require_context(
    prompt_id: str, prompt_tokens: int, max_new_tokens: int, extra: int, limit: int | None
) -> None:
    """Stop when the prompt, its completion and the reference's extra tokens do not fit."""
    needed = prompt_tokens + max_new_tokens + extra
    if limit is not None and needed > limit:
        raise HarnessError(
            f"Prompt {prompt_id} is {prompt_tokens} tokens; with --max-new-tokens "
            f"{max_new_tokens} and the reference's {extra} extra tokens it needs {needed} "
            f"positions, past the target's context of {limit} (max_position_embeddings). "
            "Shorten or drop that prompt, or lower --max-new-tokens."
        )


# What the reference's DFlash2DraftModel.from_pretrained renames (stored → module name).
REFERENCE_KEY_MAPPING = {
    f"candidate_selector.{name}": f"candidate_selector.{name}.weight"
    for name in ("predecessor_codebook", "successor_codebook")
}


def reference_key_mapping(state_dict: dict[str, Any], path: Path) -> tuple[int, dict[str, Any]]:
    """The renames of the reference's `from_pretrained` (exact names: a training
    checkpoint's names already end in `.weight`). Returns (names renamed, state dict)."""
    renamed = {REFERENCE_KEY_MAPPING.get(name, name): t for name, t in state_dict.items()}
    if len(renamed) != len(state_dict):
        both = [name for name in REFERENCE_KEY_MAPPING if name in state_dict]
        raise HarnessError(
            f"{path} stores {both} both with and without '.weight'; a DFlash-2 checkpoint "
            "has one of each codebook. Re-export the checkpoint."
        )
    return sum(name in REFERENCE_KEY_MAPPING for name in state_dict), renamed


def check_fits_target(config: DrafterConfig, target: TargetShape, where: str) -> None:
    """The selector indexes its codebooks with the target's token ids."""
    parts = config.dflash2
    if parts is None:
        return
    problems = []
    if config.vocab_size != target.vocab_size:
        problems.append(
            f"vocab_size {config.vocab_size} (rows of the selector's codebooks) != the "
            f"target's {target.vocab_size}"
        )
    if parts.selector_top_k > target.vocab_size:
        problems.append(f"selector_top_k {parts.selector_top_k} > the target's vocabulary")
    if problems:
        raise HarnessError(
            f"The DFlash-2 drafter (config from {where}) does not fit this target: "
            + "; ".join(problems)
            + ". Check that --target is the model the drafter was trained for."
        )


def check_parameters(state_dict: Mapping[str, Any], config: DrafterConfig, path: Path) -> list[str]:
    """Strict name/shape check. Returns the borrowed names set aside; raises on mismatch."""
    ignored = sorted(
        name for name in state_dict if name in BORROWED or name.endswith("rotary_emb.inv_freq")
    )
    found = {name: tuple(t.shape) for name, t in state_dict.items() if name not in ignored}
    expected = parameter_shapes(config)
    fc_shape = found.get("fc.weight")
    fc_inputs = len(config.target_layer_ids) * config.hidden_size
    fc_hint = None
    if fc_shape is not None and len(fc_shape) == 2 and fc_shape[1] != fc_inputs:
        fc_hint = (
            f"fc.weight in {path} takes {fc_shape[1]} input features, but the config says "
            f"K={len(config.target_layer_ids)} target layers {list(config.target_layer_ids)} × "
            f"hidden {config.hidden_size} = {fc_inputs}. The drafter was trained with a "
            "different set of target layers: pass the right --target-layer-ids or the "
            "drafter's own config (--drafter-config)."
        )
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    misshaped = [
        f"{name} (expected {list(expected[name])}, found {list(found[name])})"
        for name in sorted(set(expected) & set(found))
        if expected[name] != found[name] and not (name == "fc.weight" and fc_hint)
    ]
    if not (missing or unexpected or misshaped):
        if fc_hint:
            raise HarnessError(fc_hint)
        return ignored
    parts = []
    for label, names in (
        ("missing", missing),
        ("unexpected", unexpected),
        ("mis-shaped", misshaped),
    ):
        if names:
            shown = ", ".join(names[:15])
            more = f" … and {len(names) - 15} more" if len(names) > 15 else ""
            parts.append(f"{label} ({len(names)}): {shown}{more}")
    if config.dflash2 is None and any(_is_dflash2_part(name) for name in unexpected):
        parts.append(
            "the unexpected names are DFlash-2 parts (convolutions, candidate selector): "
            "this is a DFlash-2 checkpoint and needs its DFlash-2 config"
        )
    # Every mismatch at once: fixing one and rerunning to find the next wastes a target load.
    raise HarnessError(
        f"The parameters in {path} do not match the drafter config "
        f"({config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads}/{config.num_key_value_heads} heads × "
        f"{config.head_dim}): " + "; ".join(parts) + ". The checkpoint and the config "
        "describe different architectures; pass the drafter's own config "
        "(--drafter-config) or check that this is a DFlash drafter checkpoint."
        + (f" Also: {fc_hint}" if fc_hint else "")
    )


def _is_dflash2_part(name: str) -> bool:
    return name.startswith("candidate_selector.") or "_conv." in name


def parameter_shapes(config: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the drafter the config describes, by name (unprefixed, as stored),
    with its shape: the modules of model.py and model_dflash2.py, named as they name them
    (tests/unit/harness/test_parameter_shapes.py holds the two to each other)."""
    hidden, head_dim = config.hidden_size, config.head_dim
    queries, keys = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    inner = config.intermediate_size
    layer = {
        "input_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (queries, hidden),
        "self_attn.k_proj.weight": (keys, hidden),
        "self_attn.v_proj.weight": (keys, hidden),
        "self_attn.o_proj.weight": (hidden, queries),
        "self_attn.q_norm.weight": (head_dim,),
        "self_attn.k_norm.weight": (head_dim,),
        "post_attention_layernorm.weight": (hidden,),
        "mlp.gate_proj.weight": (inner, hidden),
        "mlp.up_proj.weight": (inner, hidden),
        "mlp.down_proj.weight": (hidden, inner),
    }
    parts = config.dflash2
    if parts is not None:  # a convolution pair around attention and around the MLP
        kernel, groups = parts.conv_kernel_size, hidden // parts.conv_group_size
        for conv in ("attention_conv", "mlp_conv"):
            layer[f"{conv}.base_kernel"] = (2, kernel, hidden)
            layer[f"{conv}.kernel_projection.weight"] = (2 * kernel * groups, hidden)
    shapes = {"fc.weight": (hidden, len(config.target_layer_ids) * hidden)}
    shapes["hidden_norm.weight"] = (hidden,)
    for index in range(config.num_hidden_layers):
        shapes |= {f"layers.{index}.{name}": shape for name, shape in layer.items()}
    shapes["norm.weight"] = (hidden,)
    if parts is not None:
        assert config.vocab_size, "a DFlash-2 config states its vocab_size"
        selector = "candidate_selector"
        shapes[f"{selector}.predecessor_codebook.weight"] = (config.vocab_size, parts.selector_rank)
        shapes[f"{selector}.successor_codebook.weight"] = (config.vocab_size, parts.selector_rank)
        shapes[f"{selector}.hidden_projection.weight"] = (parts.selector_rank, hidden)
    return shapes
