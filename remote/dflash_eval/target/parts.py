"""The target's input embedding and LM head, read alone from its safetensors files.

When every completion and hidden state is cached, the drafter needs only these two tensors
(dflash-spec.md §1); reading them by name costs their own bytes instead of the whole target
(54 GB for Qwen3.6-27B). Names are found by suffix, so the Qwen3 layout
(`model.embed_tokens.weight`), the vision-language wrapper's
(`model.language_model.embed_tokens.weight`) and tied embeddings (no `lm_head.weight`) are all
found the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from dflash_eval.contract.errors import HarnessError
from dflash_eval.target.config import TargetConfig

EMBED_SUFFIX = "embed_tokens.weight"
HEAD_NAME = "lm_head.weight"
NOT_THE_TEXT_EMBEDDING = ("visual", "vision", "mtp", "layers.")


@dataclass
class TargetParts:
    embed_weight: torch.Tensor  # [V, H]
    head_weight: torch.Tensor  # [V, H]
    tensors_read: list[str] = field(default_factory=list)  # "file:name", in reading order


def tensor_locations(path: Path) -> dict[str, str]:
    """Tensor name → file name, from the index when there is one, else from each header."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    locations = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            locations.update({name: file.name for name in handle.keys()})  # noqa: SIM118
    return locations


def embedding_name(names: list[str], path: Path) -> str:
    candidates = [
        name
        for name in names
        if name.endswith(EMBED_SUFFIX) and not any(part in name for part in NOT_THE_TEXT_EMBEDDING)
    ]
    if len(candidates) != 1:
        raise HarnessError(
            f"Target {path}: expected one text embedding tensor named '…{EMBED_SUFFIX}' in its "
            f"safetensors files, found {candidates}. Unsupported layout: run without the cache "
            "(--no-cache) to load the whole model."
        )
    return candidates[0]


def load_target_parts(path: Path, config: TargetConfig, dtype: torch.dtype) -> TargetParts:
    """Read the embedding and the LM head (the embedding again when they are tied)."""
    locations = tensor_locations(path)
    embed_name = embedding_name(sorted(locations), path)
    parts = TargetParts(torch.empty(0), torch.empty(0))
    parts.embed_weight = _read(Path(path), locations, embed_name, dtype, parts)
    if HEAD_NAME in locations:
        parts.head_weight = _read(Path(path), locations, HEAD_NAME, dtype, parts)
    elif config.tied_embeddings:
        parts.head_weight = parts.embed_weight
    else:
        raise HarnessError(
            f"Target {path}: no {HEAD_NAME} tensor and the config does not tie the embeddings; "
            "the drafter needs the target's LM head."
        )
    return parts


def _read(
    path: Path, locations: dict[str, str], name: str, dtype: torch.dtype, parts: TargetParts
) -> torch.Tensor:
    file = locations[name]
    with safe_open(str(path / file), framework="pt") as handle:
        tensor = handle.get_tensor(name).to(dtype)
    parts.tensors_read.append(f"{file}:{name}")
    return tensor
