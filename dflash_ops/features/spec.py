"""What a feature set is made from, and the id that names it everywhere.

A set is fixed by its prompts, the target layers it holds, the block size it extends each
completion by, the completion length, the thinking switch and the target's fingerprint, and
by how it is asked to be computed: the target dtype and device (as requested: `auto` stays
`auto`) and the completions' source (local greedy or SGLang), which change its numbers. Its
id is `<target name>-<12 hex>`: the sha256 of those inputs, computed here on the workstation
from what it sends, so the same request names the same set on every host and a rerun finds it,
while a request for other numbers (a float32 set after a bf16 one) never gets the old set.

Which layers and block size (the first rule that gives them wins):

1. `--layers 1,9,17 --block-size 16` on the command line;
2. the trainer's drafter profile in the inventory (`drafter.target_layer_ids`, `block_size`,
   or the DFlash config.json its `config_file` names);
3. otherwise an error that lists both ways. A staged checkpoint is not read for them: a set
   is computed before (and for) many checkpoints, which all share the trainer's profile.

A set holds features for a drafter when the drafter's layers are among the set's and its
block size is at most the set's (the harness checks both when it uses the set).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from dflash_eval.contract.options import MAX_LAYER, default
from dflash_eval.contract.prompts import BUILTIN_PROMPTS

from dflash_ops.core.arguments import parse_number
from dflash_ops.core.errors import InventoryError, OpsError
from dflash_ops.core.inventory import Inventory

SET_RECORD = "feature-set.json"  # what the harness writes into a complete set
ID_HEX = 12


@dataclass(frozen=True)
class FeatureRequest:
    """The inputs that fix a set's content (and so its id), plus how to compute it."""

    layers: tuple[int, ...]
    block_size: int
    max_new_tokens: int = default("max_new_tokens")  # the harness's (eval --max-new-tokens)
    thinking: bool = False
    prompts: Path | None = None  # a local JSONL file; None: the harness's built-in prompts
    target_dtype: str | None = None
    device: str | None = None  # auto | cpu | cuda on the features host (harness default: auto)
    sglang: bool = False  # reference completions from the features host's sglang_url
    threads: int | None = None

    @property
    def prompts_sha256(self) -> str:
        """Of the prompt file's bytes, or of the built-in prompts' texts."""
        if self.prompts is not None:
            return hashlib.sha256(self.prompts.read_bytes()).hexdigest()
        return hashlib.sha256(json.dumps(list(BUILTIN_PROMPTS)).encode()).hexdigest()


def set_id(request: FeatureRequest, target_name: str, target_fingerprint: str) -> str:
    """`<target name>-<12 hex>` over everything that decides the set's content."""
    inputs = {
        "prompts_sha256": request.prompts_sha256,
        "layers": list(request.layers),
        "block_size": request.block_size,
        "max_new_tokens": request.max_new_tokens,
        "thinking": request.thinking,
        "target_fingerprint": target_fingerprint,
        "target_dtype": request.target_dtype or "auto",
        "device": request.device or "auto",
        "completions": "sglang" if request.sglang else "local",
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", target_name) or "target"
    return f"{name}-{digest[:ID_HEX]}"


def parse_layers(text: str) -> tuple[int, ...]:
    """'1,9,17' → (1, 9, 17): distinct non-negative layer indices."""
    layers = tuple(
        parse_number("--layers", part, minimum=0, maximum=MAX_LAYER, whole=True)
        for part in text.split(",")
        if part.strip()
    )
    if not layers or len(set(layers)) != len(layers):
        raise OpsError(f"--layers: expected distinct indices ≥ 0, found {text!r}")
    return layers


def choose_layers(
    inventory: Inventory, layers: str | None, block_size: int | None
) -> tuple[tuple[int, ...], int]:
    """The set's target layers and block size: the flags, else the drafter profile."""
    profile = _profile_settings(inventory)
    chosen_layers = parse_layers(layers) if layers else profile.get("target_layer_ids")
    chosen_block = block_size or profile.get("block_size")
    missing = [
        flag
        for flag, value in (("--layers", chosen_layers), ("--block-size", chosen_block))
        if not value
    ]
    if missing:
        raise OpsError(
            f"extract-features needs the target layers and block size of the drafters it is "
            f"for; {' and '.join(missing)} not known. Pass --layers 1,9,17 --block-size 16, or "
            f"state them in the inventory's drafter profile (hosts.{inventory.trainer_name}."
            "drafter: target_layer_ids and block_size, or a config_file with them)."
        )
    if chosen_block < 2:
        raise OpsError(f"--block-size: expected at least 2, found {chosen_block}")
    return tuple(chosen_layers), int(chosen_block)


def _profile_settings(inventory: Inventory) -> dict:
    """target_layer_ids / block_size from the trainer's drafter profile (its fields first,
    then its config file's, at the top level or under dflash_config)."""
    profile = inventory.trainer.drafter
    if profile is None:
        return {}
    found: dict = {}
    if profile.config_file is not None:
        path = inventory.path.parent / profile.config_file
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InventoryError(
                f"{inventory.path}: hosts.{inventory.trainer_name}.drafter.config_file: cannot "
                f"read {path} as JSON ({exc}); fix the path or the file"
            ) from None
        nested = config.get("dflash_config") or {}
        for key in ("target_layer_ids", "block_size"):
            value = nested.get(key, config.get(key))
            if value is not None:
                found[key] = value
    if profile.target_layer_ids is not None:
        found["target_layer_ids"] = profile.target_layer_ids
    if profile.block_size is not None:
        found["block_size"] = profile.block_size
    return found
