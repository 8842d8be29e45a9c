"""Faulty lab drafters: trained like the lab's own (models.py) with one thing wrong, the
way real drafters go wrong, so that `diagnose` can be shown to find the cause.

Each fault is a training recipe plus what its checkpoint then claims (the config it carries):

- layer-ids: trained on target layers 2,4; its config names 1,3 (the lab default). Built
  on the context lab (context_models.py): the main lab target's next token depends on the
  current one alone, so its drafters use no features and wrong layers change nothing;
- block-size: trained with blocks of 16; its config (and training args) say 8;
- soft-target: trained to match the target's softmax at a temperature (KL) instead of its
  greedy token: flat, under-confident slots. The lab target is near one-hot at temperature
  2 (mean top-1 probability 0.9999, so that fault changes nothing here); at 8 its mean top-1
  is 0.33, about as flat as a real target's at 2, so the lab uses 8;
- fc-width: trained on three target layers 1,3,5 (`fc` is 3·H wide); its config names two;
- feature-noise: trained on target features with Gaussian noise added (σ = 16 times their
  standard deviation; at 1 the noise only regularises, at 4 it still reads them 0.83 as much
  as the reference does, and neither is measurably behind it);
  eval feeds clean ones. No setting repairs it: its signature is that zeroing the features
  costs it far less τ than the reference;
- loss-layer: `fc` trained over layers 1,5, where 5 is the target's last (the loss layer, whose
  output the logits come from); its config names 1,3. Repaired by the loss layer as the last id.

Config edits are a copy of the lab's own step-6000 drafter with one value of its config (and
training args) changed, as a user who edits a config by hand would leave it (`EDITS`):
block size understated (4) or overstated (16), a wrong mask token, the attention rule
(`is_causal` true on a drafter trained with full layers seeing the whole block: the lab's
drafters hardly use a block's later mask slots, so this one moves τ by less than noise and is
no fault of the benchmark's suite; diagnose must still measure it).

The checkpoints are labelled step 6000 (150 real optimisation steps, as the lab's best; the
fc-width one needs a single step; layer-ids 24000, as the context lab's drafter) and cached
per fault beside the lab models they are built from.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_lab.context_models import DRAFTER_STEP as CONTEXT_STEP
from dflash_lab.models import LabModels, Training, train_drafter

FAULT_STEP = 6000


@dataclass(frozen=True)
class Fault:
    training: Training
    claims: dict[str, Any] = field(default_factory=dict)  # config values the checkpoint states
    summary: str = ""
    step: int = FAULT_STEP  # the label (models.REAL_STEPS_PER_1000 real steps per 1000)


FAULTS = {
    "layer-ids": Fault(
        Training(layer_ids=(2, 4)),
        {"target_layer_ids": [1, 3]},
        "trained on target layers [2, 4], config names [1, 3]",
        step=CONTEXT_STEP,  # the context lab's: a drafter must have learnt to read features
    ),
    "block-size": Fault(
        Training(block_size=16), {"block_size": 8}, "trained with block size 16, config says 8"
    ),
    "soft-target": Fault(
        Training(soft_temperature=8.0),
        {},
        "trained on the target's softmax at temperature 8 (KL), not its greedy token",
    ),
    "fc-width": Fault(
        Training(layer_ids=(1, 3, 5)),
        {"target_layer_ids": [1, 3]},
        "fc trained over target layers [1, 3, 5], config names [1, 3]",
        step=40,  # one real step: the fault is in the shapes, not in what was learnt
    ),
    # Both on the context lab: the main lab's drafters use no features, so neither fault
    # changes anything there.
    "feature-noise": Fault(
        Training(feature_noise=16.0),
        {},
        "trained on target features with Gaussian noise of 16 times their standard deviation",
        step=CONTEXT_STEP,
    ),
    "loss-layer": Fault(
        Training(layer_ids=(1, 5)),
        {"target_layer_ids": [1, 3]},
        "fc trained over target layers [1, 5] (5: the loss layer), config names [1, 3]",
        step=CONTEXT_STEP,
    ),
}


# A lab drafter (step 6000) with its config edited: the weights are right, one value is not.
EDITS = {
    "block-size-down": {"block_size": 4},
    "block-size-up": {"block_size": 16},
    "mask-token": {"mask_token_id": 7},  # an ordinary token of the lab's vocabulary
    # Trained with the lab's rule (its full-attention layers see the whole block); the config
    # now makes every layer causal, as a config written for another version of z-lab's code.
    "attention-rule": {"is_causal": True},
}


def edited_drafter(lab: LabModels, edit: str) -> Path:
    """The lab's step-6000 checkpoint with one config value edited (made once, then kept)."""
    checkpoint = lab.target_dir.parent / "faulty" / f"edit-{edit}" / "step_6000" / "checkpoint.pt"
    if not checkpoint.is_file():
        partial = checkpoint.with_name(f"{checkpoint.name}.{os.getpid()}.partial")
        partial.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lab.checkpoints[6000], partial)
        _state_claims(partial, EDITS[edit])
        partial.replace(checkpoint)
    return checkpoint


def build_faulty_drafter(lab: LabModels, fault: str, seed: int = 1) -> Path:
    """The training checkpoint of a drafter with `fault` (built once, then cached)."""
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    spec = FAULTS[fault]
    root = lab.target_dir.parent / "faulty" / f"{fault}-{seed}"
    checkpoint = root / f"step_{spec.step}" / "checkpoint.pt"
    if checkpoint.is_file():
        return checkpoint
    root.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{root.name}.", suffix=".partial", dir=root.parent))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = Qwen3ForCausalLM.from_pretrained(str(lab.target_dir)).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(lab.target_dir))
        generator = torch.Generator().manual_seed(seed)
        train_drafter(partial, target, tokenizer, (spec.step,), generator, spec.training)
        _state_claims(partial / f"step_{spec.step}" / "checkpoint.pt", spec.claims)
        (partial / "fault.json").write_text(json.dumps({"fault": fault, "summary": spec.summary}))
        partial.rename(root)
    except OSError:
        if not checkpoint.is_file():
            raise
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(partial, ignore_errors=True)
    return checkpoint


def _state_claims(path: Path, claims: dict[str, Any]) -> None:
    """Rewrite the checkpoint's config (and training args) to claim these values."""
    import torch

    if not claims:
        return
    saved = torch.load(path, weights_only=True)
    config = saved["config"]
    for key, value in claims.items():
        if key in config.get("dflash_config", {}):
            config["dflash_config"][key] = value
        else:
            config[key] = value
        if key != "target_layer_ids":
            saved["args"][key] = value
    torch.save(saved, path)
