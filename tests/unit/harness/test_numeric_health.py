"""Numeric health (dflash_eval.drafter.health) on the lab's tiny models: a drafter with NaN weights,
a drafter whose logits overflow, and a prompt longer than the target's context each stop the
run with one paragraph naming the tensor or the prompt, instead of a meaningless τ."""

from __future__ import annotations

import json

import pytest
import torch
from dflash_eval.contract.errors import HarnessError

from .helpers import quick_eval


def altered_checkpoint(lab, tmp_path, name: str, change) -> object:
    """The lab's step-6000 checkpoint with `change(tensor)` applied to its tensor `name`."""
    checkpoint = torch.load(lab.checkpoints[6000], weights_only=True)
    tensor = checkpoint["model_state_dict"][f"module.{name}"]
    change(tensor)
    path = tmp_path / "altered.pt"
    torch.save(checkpoint, path)
    return path


def test_a_drafter_with_a_nan_weight_stops_naming_the_tensor(lab, tmp_path):
    path = altered_checkpoint(
        lab, tmp_path, "layers.0.mlp.up_proj.weight", lambda t: t.view(-1)[7].fill_(torch.nan)
    )
    with pytest.raises(HarnessError) as caught:
        quick_eval(lab, tmp_path, checkpoint=path, num_prompts=1, max_new_tokens=8)
    message = str(caught.value)
    assert f"Drafter weights in {path}: layers.0.mlp.up_proj.weight" in message
    assert "holds 1 non-finite value(s)" in message
    assert not (tmp_path / "r.json").exists()  # no results with a τ of 1


def test_logits_that_overflow_stop_the_run_naming_the_prompt(lab, tmp_path):
    """Finite weights whose product is not: the final norm's scale near float32's largest
    value makes every logit infinite."""
    path = altered_checkpoint(lab, tmp_path, "norm.weight", lambda t: t.fill_(3e38))
    with pytest.raises(HarnessError) as caught:
        quick_eval(lab, tmp_path, checkpoint=path, num_prompts=1, max_new_tokens=8)
    message = str(caught.value)
    assert "The drafter's logits for prompt lab-0 hold NaN or inf" in message
    assert "the drafter's own computation overflows" in message


def test_a_prompt_longer_than_the_target_context_stops_before_any_work(lab, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    long = " ".join(["tokens"] * 3000)  # the lab target's context is 1024 positions
    lines = [{"id": "short", "prompt": "hello"}, {"id": "huge", "prompt": long}]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(HarnessError) as caught:
        quick_eval(lab, tmp_path, prompts=prompts, num_prompts=2, max_new_tokens=8)
    message = " ".join(str(caught.value).split())
    assert "Prompt huge is " in message and "past the target's context of 1024" in message
    assert "--max-new-tokens 8" in message
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.pt"))
