"""Target families: Qwen3, Qwen3.5 text (linear attention) and the vision-language wrapper."""

from __future__ import annotations

import pytest
import torch
from dflash_eval.contract.progress import Progress
from dflash_eval.run.evaluate import run_eval
from dflash_eval.run.options import EvalOptions
from dflash_eval.target.model import load_target

from .helpers import random_drafter, save_tiny_qwen3_5, save_training_checkpoint, small_config


def test_qwen3_parts_are_found_and_layers_map_to_hidden_states(lab):
    target = load_target(lab.target_dir, "float32")
    assert target.family == "qwen3" and target.num_layers == 6
    assert target.decoder is target.model.model
    tokens = [10, 20, 30, 40]
    features = target.hidden_features(tokens, [0, 5])
    # Layer 0's output is hidden_states[1]: run the embedding and layer 0 by hand.
    with torch.no_grad():
        manual = target.model(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    torch.testing.assert_close(features[0], manual[1][0])
    assert not torch.equal(features[0], manual[0][0])


@pytest.mark.parametrize("wrapper", [False, True], ids=["qwen3_5-text", "qwen3_5-vl-wrapper"])
def test_qwen3_5_targets_evaluate_end_to_end(lab, tmp_path, wrapper):
    target_dir = save_tiny_qwen3_5(tmp_path / "target", lab.target_dir, 101, wrapper)
    target = load_target(target_dir)
    assert target.num_layers == 4
    # A wrapper's text decoder is loaded alone (test_target_loading.py), as the text model.
    assert target.decoder is target.model.model
    assert target.family.endswith("(vision-language wrapper)") == wrapper
    drafter = random_drafter(small_config(target_layer_ids=(1, 2), mask_token_id=3))
    checkpoint = save_training_checkpoint(tmp_path / "checkpoint.pt", drafter)
    results = run_eval(
        EvalOptions(
            checkpoint=checkpoint,
            target=target_dir,
            out=tmp_path / "results.json",
            threads=1,
            prompts=lab.prompts,
            num_prompts=2,
            max_new_tokens=10,
            ddtree=[4],
        ),
        Progress(quiet=True),
    )
    assert ("vision-language" in results["target"]["family"]) == wrapper
    assert results["metrics"]["rounds"] > 0
    # Capped at the completion: every completion token but the first is committed once.
    assert results["metrics"]["capped"]["committed_tokens"] == 2 * 9
