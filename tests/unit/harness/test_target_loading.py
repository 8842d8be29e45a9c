"""The target as transformers reads it: layer kinds from its config class (a Qwen3.5 config
without `layer_types` is hybrid), a vision-language wrapper loaded text-only, every text weight
from the files, and the dtype the results record checked on the loaded weights."""

from __future__ import annotations

import json

import pytest
import torch
from dflash_eval.contract.errors import HarnessError
from dflash_eval.target.config import read_target_config
from dflash_eval.target.dtype import choose_target_dtype
from dflash_eval.target.features import fidelity_needed, kernel_record
from dflash_eval.target.model import load_target, require_loaded_as
from safetensors.torch import load_file, save_file

from .helpers import save_tiny_qwen3_5

GIB = 2**30


def hybrid_config_json(directory, **pattern) -> None:
    """A Qwen3.5 text config.json written as a release might: the hybrid pattern stated by
    `full_attention_interval` or not at all, never as `layer_types`."""
    directory.mkdir(parents=True)
    config = {
        "model_type": "qwen3_5_text",
        "num_hidden_layers": 8,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "vocab_size": 101,
        "dtype": "bfloat16",
        **pattern,
    }
    (directory / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("pattern", "linear"),
    [
        ({"full_attention_interval": 4}, [0, 1, 2, 4, 5, 6]),
        ({"full_attention_interval": 2}, [0, 2, 4, 6]),
        ({}, [0, 1, 2, 4, 5, 6]),  # the class's own default: one full layer in four
    ],
    ids=["interval-4", "interval-2", "no-pattern"],
)
def test_a_config_without_layer_types_is_read_as_hybrid(tmp_path, pattern, linear):
    hybrid_config_json(tmp_path / "t", **pattern)
    config = read_target_config(tmp_path / "t")
    assert config.linear_attention_layers == linear
    assert config.saved_dtype == "bfloat16" and config.shape.num_layers == 8
    # So the CPU rule computes its features in float32, and the fidelity guard applies.
    chosen = choose_target_dtype("auto", config.saved_dtype, config, GIB, 100 * GIB)
    assert (chosen.name, chosen.source) == ("float32", "auto: float32 for linear attention on CPU")
    assert fidelity_needed(config, [1, 5], "bfloat16") is None
    assert "linear_attention" in kernel_record(config)


def test_a_model_type_this_transformers_cannot_build_stops_with_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen9_omni_future"}))
    with pytest.raises(HarnessError) as caught:
        read_target_config(tmp_path)
    message = str(caught.value)
    assert "cannot read the target" in message and "'qwen9_omni_future'" in message
    assert "Install a transformers version that supports this model family" in message
    assert "\n" not in message


def parameter_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_a_vision_language_target_is_loaded_text_only_with_the_same_features(lab, tmp_path):
    from transformers import AutoModelForImageTextToText

    target_dir = save_tiny_qwen3_5(tmp_path / "vl", lab.target_dir, 101, wrapper=True)
    target = load_target(target_dir, "float32")
    names = [name for name, _ in target.model.named_parameters()]
    assert not [n for n in names if "visual" in n or "vision" in n or "mtp" in n]
    whole = AutoModelForImageTextToText.from_pretrained(str(target_dir), dtype=torch.float32)
    tokens = [1, 5, 7, 9, 11, 13]
    with torch.no_grad():
        expected = whole(input_ids=torch.tensor([tokens]), output_hidden_states=True)
    features = target.hidden_features(tokens, [0, 2, 3])
    for layer, hidden in features.items():
        torch.testing.assert_close(hidden, expected.hidden_states[layer + 1][0], rtol=0, atol=0)
    torch.testing.assert_close(target.head_weight, whole.lm_head.weight, rtol=0, atol=0)
    saved = parameter_bytes(whole) - parameter_bytes(target.model)
    vision = sum(p.numel() * p.element_size() for n, p in whole.named_parameters() if "visual" in n)
    assert saved == vision > 0  # exactly the vision tower is not held


def test_a_text_weight_missing_from_the_files_stops_the_run_naming_it(lab, tmp_path):
    target_dir = save_tiny_qwen3_5(tmp_path / "vl", lab.target_dir, 101, wrapper=True)
    weights = load_file(target_dir / "model.safetensors")
    del weights["model.language_model.layers.3.mlp.down_proj.weight"]
    save_file(weights, target_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        HarnessError, match=r"1 text weight\(s\) missing.*layers\.3\.mlp\.down_proj"
    ):
        load_target(target_dir, "float32")


def test_weights_in_another_dtype_than_recorded_stop_the_run(lab):
    target = load_target(lab.target_dir, "float32")
    require_loaded_as(target.model, torch.float32, "cpu", lab.target_dir)  # as asked: fine
    target.model.model.layers[2].to(torch.bfloat16)  # what a dtype-ignoring load leaves
    with pytest.raises(HarnessError) as caught:
        require_loaded_as(target.model, torch.float32, "cpu", lab.target_dir)
    assert "asked transformers for torch.float32 on cpu, but its weights are" in str(caught.value)
    assert "torch.bfloat16 on cpu" in str(caught.value)
