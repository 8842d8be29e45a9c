"""The repairs a diagnosis tries: one setting of the candidate's config changed at a time.
Torch-free, so that `plan --diagnose` can count them (and estimate their time) without
loading anything."""

from __future__ import annotations

from typing import Any, Protocol

from dflash_eval.drafter.config import default_target_layer_ids

OTHER = "the other drafter"  # in repair labels


class Settings(Protocol):
    """What a repair changes of a drafter's config (a DFlash config, or the plan's facts)."""

    target_layer_ids: Any
    block_size: int
    mask_token_id: int | None


def repair_settings(
    config: Settings,
    other: Settings,
    num_layers: int,
    vocab_size: int,
    special_tokens: dict[str, int],
) -> list[dict[str, Any]]:
    """One setting changed at a time: the target layer ids (each ±1, all ±1, the default
    rule's, the other drafter's), the block size (half, double, the other's) and the mask
    token (the other drafter's, the tokenizer's special tokens); never the candidate's own."""
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
    return settings


def special_tokens(tokenizer: Any) -> dict[str, int]:
    names = ("mask_token", "pad_token", "unk_token")
    found = {name: getattr(tokenizer, f"{name}_id", None) for name in names}
    return {name.replace("_", " "): token for name, token in found.items() if token is not None}
