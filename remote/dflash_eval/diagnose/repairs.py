"""The repairs a diagnosis tries: one setting of the candidate's config changed at a time,
and the target features in float32 where the run's are not. Torch-free, so that
`plan --diagnose` can count them (and estimate their time) without loading anything."""

from __future__ import annotations

from typing import Any, Protocol

from dflash_eval.drafter.config import default_target_layer_ids, is_causal_layer

OTHER = "the other drafter"  # in repair labels


class Settings(Protocol):
    """What a repair changes of a drafter's config (a DFlash config, or the plan's facts)."""

    target_layer_ids: Any
    block_size: int
    mask_token_id: int | None
    num_hidden_layers: int
    layer_types: Any  # None: every layer full attention
    is_causal: bool | None


def repair_settings(
    config: Settings,
    other: Settings,
    num_layers: int,
    vocab_size: int,
    special_tokens: dict[str, int],
) -> list[dict[str, Any]]:
    """One setting changed at a time: the target layer ids (each ±1, all ±1, the default
    rule's, the other drafter's, the loss layer as the last), the block size (half, double,
    the other's), the mask token (the other drafter's, the tokenizer's special tokens) and the
    attention rule (every layer causal, or none); never the candidate's own."""
    layer_ids = list(config.target_layer_ids)
    layer_choices: list[tuple[str, list[int]]] = []
    for index, layer in enumerate(layer_ids):
        for shift in (-1, 1):
            moved = [*layer_ids[:index], layer + shift, *layer_ids[index + 1 :]]
            layer_choices.append((f"target layer id {layer} → {layer + shift}", moved))
    for shift in (-1, 1):
        layer_choices.append((f"all target layer ids {shift:+d}", [i + shift for i in layer_ids]))
    default = default_target_layer_ids(num_layers, len(layer_ids))
    layer_choices.append(("the default rule's target layer ids", default))
    layer_choices.append((f"{OTHER}'s target layer ids", list(other.target_layer_ids)))
    # A drafter trained with the loss layer (the one the target's logits come from) among its
    # feature layers, under a config that names the usual ones.
    loss_layer = [*layer_ids[:-1], num_layers - 1]
    layer_choices.append((f"the loss layer {num_layers - 1} as the last target layer", loss_layer))
    settings, seen = [], {tuple(layer_ids)}
    for label, ids in layer_choices:
        fits = len(ids) == len(layer_ids) and all(0 <= i < num_layers for i in ids)
        if fits and tuple(ids) not in seen:
            seen.add(tuple(ids))
            settings.append({"setting": "target_layer_ids", "label": label, "value": ids})
    block = config.block_size
    for size in sorted({block // 2, block * 2, other.block_size} - {block}):
        if size >= 2:
            label = f"block size {size} (config {block})"
            settings.append({"setting": "block_size", "label": label, "value": size})
    masks = {f"{OTHER}'s mask token": other.mask_token_id}
    masks.update({f"the tokenizer's {name}": token for name, token in special_tokens.items()})
    tried = {config.mask_token_id}
    for label, token in masks.items():
        if token is not None and 0 <= token < vocab_size and token not in tried:
            tried.add(token)
            label = f"{label} {token} (config {config.mask_token_id})"
            settings.append({"setting": "mask_token_id", "label": label, "value": token})
    return settings + attention_settings(config, other)


def attention_settings(config: Settings, other: Settings | None = None) -> list[dict[str, Any]]:
    """`is_causal` true and false, each where it changes what some layer sees (a drafter
    trained with the other rule than its config states: z-lab's code changed it in 07ebd93).
    `as_other`: the layers then see what the other drafter's layers see."""
    kinds = _kinds(config)
    stated = [is_causal_layer(kind, config.is_causal) for kind in kinds]
    theirs = [is_causal_layer(kind, other.is_causal) for kind in _kinds(other)] if other else None
    settings = []
    for value, rule in ((True, "every layer causal"), (False, "no layer causal")):
        changed = [is_causal_layer(kind, value) for kind in kinds]
        if changed != stated:
            label = f"{rule} (config: {_rule(config.is_causal)})"
            setting = {"setting": "is_causal", "label": label, "value": value}
            settings.append({**setting, "as_other": changed == theirs})
    return settings


def dtype_settings(features_dtype: str, drifts: bool) -> list[dict[str, Any]]:
    """The target features in float32 when the run's are in another dtype and `drifts` (a
    linear-attention layer feeds them: on CPU their bf16 features drift from the ones the
    drafter was trained on; a plain target's are the same in either dtype)."""
    if features_dtype == "float32" or not drifts:
        return []
    label = f"target features in float32 (the run's: {features_dtype})"
    return [{"setting": "features_dtype", "label": label, "value": "float32"}]


def _kinds(config: Settings) -> list[str]:
    return list(config.layer_types or ["full_attention"] * config.num_hidden_layers)


def _rule(is_causal: bool | None) -> str:
    if is_causal is None:
        return "sliding layers causal, full layers not"
    return f"is_causal {str(is_causal).lower()}"


def special_tokens(tokenizer: Any) -> dict[str, int]:
    names = ("mask_token", "pad_token", "unk_token")
    found = {name: getattr(tokenizer, f"{name}_id", None) for name in names}
    return {name.replace("_", " "): token for name, token in found.items() if token is not None}
