"""A tiny DFlash-2 drafter for the lab target, saved as z-lab publishes one and as a trainer
saves one.

Its DFlash body is the lab's trained step-6000 drafter, so rounds get drafts accepted; the
DFlash-2 parts are random: convolutions near the identity (offset-0 weight about 1) so the
body's skill survives, and a selector whose pairwise term is strong enough to override the
per-slot argmax in some slots. Names and config keys are the reference's (z-lab/dflash,
tests/fixtures/dflash2-*.json): the Hugging Face form stores the two codebooks without
`.weight`, the training form under the module names with a `module.` prefix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

KERNEL, GROUP, RANK, TOP_K = 3, 16, 8, 4
CODEBOOKS = ("predecessor_codebook", "successor_codebook")


@dataclass(frozen=True)
class DFlash2Files:
    config: dict[str, Any]  # config.json, the reference's keys
    weights: dict[str, torch.Tensor]  # module names (after the reference's renames)
    hf_dir: Path  # config.json + model.safetensors (stored names)
    checkpoint: Path  # training checkpoint.pt without a config
    profile: Path  # a drafter profile carrying the config


def dflash2_config(base: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """The lab drafter's config made DFlash-2, keys where the reference's fixture has them."""
    config = json.loads(json.dumps(base))
    config["architectures"] = ["DFlash2DraftModel"]
    config["vocab_size"] = vocab_size
    config["dflash_config"].update(
        conv_kernel_size=KERNEL, conv_group_size=GROUP, selector_rank=RANK, selector_top_k=TOP_K
    )
    return config


def dflash2_weights(body: dict[str, torch.Tensor], config: dict[str, Any], seed: int = 0):
    generator = torch.Generator().manual_seed(seed)

    def noise(*shape: int, std: float) -> torch.Tensor:
        return std * torch.randn(*shape, generator=generator)

    hidden, vocab = config["hidden_size"], config["vocab_size"]
    weights = dict(body)
    for i in range(config["num_hidden_layers"]):
        for conv in ("attention_conv", "mlp_conv"):
            base = noise(2, KERNEL, hidden, std=0.1)
            base[:, 0] += 1.0
            weights[f"layers.{i}.{conv}.base_kernel"] = base
            weights[f"layers.{i}.{conv}.kernel_projection.weight"] = noise(
                2 * KERNEL * hidden // GROUP, hidden, std=0.03
            )
    weights["candidate_selector.hidden_projection.weight"] = noise(RANK, hidden, std=0.15)
    for name in CODEBOOKS:
        weights[f"candidate_selector.{name}.weight"] = noise(vocab, RANK, std=0.4)
    return weights


def hf_names(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """As a published DFlash-2 model.safetensors stores them (before the renames)."""
    stored = {name: t.clone().contiguous() for name, t in weights.items()}
    for name in CODEBOOKS:
        stored[f"candidate_selector.{name}"] = stored.pop(f"candidate_selector.{name}.weight")
    return stored


def save_hf_dir(directory: Path, config: dict[str, Any], stored: dict[str, torch.Tensor]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file(stored, str(directory / "model.safetensors"))
    return directory


def build_dflash2_files(lab_checkpoint: Path, vocab_size: int, root: Path) -> DFlash2Files:
    saved = torch.load(lab_checkpoint, weights_only=True)
    body = {k.removeprefix("module."): v for k, v in saved["model_state_dict"].items()}
    config = dflash2_config(saved["config"], vocab_size)
    weights = dflash2_weights(body, config)
    hf_dir = save_hf_dir(root / "hf", config, hf_names(weights))
    checkpoint = root / "train" / "step_700" / "checkpoint.pt"
    checkpoint.parent.mkdir(parents=True)
    torch.save(
        {
            "model_state_dict": {f"module.{k}": v.clone() for k, v in weights.items()},
            "optimizer_state_dict": {"state": {}, "param_groups": []},
            "step": 700,
        },
        checkpoint,
    )
    profile = root / "profile.json"
    profile.write_text(json.dumps({"name": "dflash2-lab", "config": config}))
    return DFlash2Files(config, weights, hf_dir, checkpoint, profile)
