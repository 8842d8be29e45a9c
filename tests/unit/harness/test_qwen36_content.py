"""The lab's miniature Qwen3.6 target (`dflash-lab up --content qwen3.6`, dflash_lab/qwen36.py):
saved as the release is, read as hybrid also when its config states only the interval, loaded
text-only, and with a reference drafter whose sliding layers are causal.

The content is built once per machine into the lab's model cache, as `dflash-lab up` builds it.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from dflash_eval.drafter.loaders import load_drafter
from dflash_eval.reference.conversation import encode_messages, template_reads_thinking
from dflash_eval.target.config import read_target_config
from dflash_eval.target.files import load_tokenizer
from dflash_eval.target.model import load_target
from safetensors import safe_open

from dflash_lab.content import MODEL_CACHE, content_generator, qwen36_models
from dflash_lab.models import LabModels
from dflash_lab.qwen36 import REFERENCE, SHARDS, build_qwen36_models
from dflash_ops.core.errors import LabError

from .helpers import quick_eval

HYBRID = ["linear_attention"] * 3 + ["full_attention"]
LINEAR_LAYERS = [0, 1, 2, 4, 5, 6]


@pytest.fixture(scope="module")
def qwen36() -> LabModels:
    return build_qwen36_models(MODEL_CACHE)


def test_the_miniature_is_saved_as_the_release_is(qwen36):
    target = qwen36.target_dir
    config = json.loads((target / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert config["model_type"] == "qwen3_5" and config["vision_config"]["depth"] > 0
    text = config["text_config"]
    assert text["layer_types"] == HYBRID * 2 and text["full_attention_interval"] == 4
    assert text["mtp_num_hidden_layers"] == 1 and not config["tie_word_embeddings"]
    index = json.loads((target / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    files = sorted({*weight_map.values()})
    assert files == sorted(f.name for f in target.glob("*.safetensors")) and len(files) == SHARDS
    total = 0
    for file in files:
        with safe_open(str(target / file), framework="pt") as handle:
            assert set(handle.keys()) == {n for n, f in weight_map.items() if f == file}
            for name in handle.keys():  # noqa: SIM118
                tensor = handle.get_tensor(name)
                assert tensor.dtype == torch.bfloat16, name
                total += tensor.numel() * tensor.element_size()
    assert index["metadata"]["total_size"] == total
    prefixes = {name.split(".")[0] + "." + name.split(".")[1] for name in weight_map}
    assert prefixes == {"model.visual", "model.language_model", "lm_head.weight", "mtp.fc"} | {
        "mtp.layers",
        "mtp.norm",
        "mtp.pre_fc_norm_hidden",
        "mtp.pre_fc_norm_embedding",
    }
    generation = json.loads((target / "generation_config.json").read_text())
    assert isinstance(generation["eos_token_id"], list) and len(generation["eos_token_id"]) == 2


def test_its_chat_template_thinks_unless_told_not_to(qwen36):
    tokenizer = load_tokenizer(qwen36.target_dir)
    messages = [{"role": "user", "content": "hi"}]
    frame = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    asked = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert asked == frame + "<think>\n"
    off = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off == frame + "<think>\n\n</think>\n\n"
    assert template_reads_thinking(tokenizer)
    ids, templated = encode_messages(tokenizer, (("user", "hi"),), thinking=True)
    assert templated and ids[-2] == tokenizer.convert_tokens_to_ids("<think>")


def without_layer_types(qwen36: LabModels, directory):
    """A copy of the target whose config states its pattern only as full_attention_interval."""
    shutil.copytree(qwen36.target_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    del config["text_config"]["layer_types"]
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_without_layer_types_the_target_is_read_and_evaluated_as_hybrid(qwen36, tmp_path):
    variant = without_layer_types(qwen36, tmp_path / "no-layer-types")
    for directory in (qwen36.target_dir, variant):
        config = read_target_config(directory)
        assert config.vision_language and config.family == "qwen3_5 (vision-language wrapper)"
        assert config.linear_attention_layers == LINEAR_LAYERS
        assert config.saved_dtype == "bfloat16"
    as_saved, variant_results = (
        quick_run(qwen36, directory, tmp_path / name)
        for directory, name in ((qwen36.target_dir, "saved"), (variant, "variant"))
    )
    for results in (as_saved, variant_results):
        features = results["features"]
        assert (features["dtype"], features["dtype_source"]) == (
            "float32",
            "auto: float32 for linear attention on CPU",
        )
        assert features["kernel"]["linear_attention"] == "torch fallback"
    assert variant_results["metrics"]["tau_macro"] == as_saved["metrics"]["tau_macro"]
    assert variant_results["metrics"]["histogram"] == as_saved["metrics"]["histogram"]


def quick_run(qwen36: LabModels, target, directory, **overrides) -> dict:
    """A short evaluation of the step-6000 drafter on `target`, with its own cache."""
    return quick_eval(
        qwen36, directory, target=target, num_prompts=2, max_new_tokens=32, **overrides
    )


def parameter_bytes(model: torch.nn.Module, part: str = "") -> int:
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if part in n)


def test_text_only_loading_holds_no_vision_tower_and_the_same_features(qwen36):
    from transformers import AutoModelForImageTextToText

    target = load_target(qwen36.target_dir, "float32")
    names = [name for name, _ in target.model.named_parameters()]
    assert not [n for n in names if "visual" in n or "mtp" in n]
    whole = AutoModelForImageTextToText.from_pretrained(str(qwen36.target_dir), dtype=torch.float32)
    tokens = [7, 20, 31, 42, 53, 64, 75, 86]
    with torch.no_grad():
        expected = whole(input_ids=torch.tensor([tokens]), output_hidden_states=True)
    for layer, hidden in target.hidden_features(tokens, [1, 3, 5]).items():
        torch.testing.assert_close(hidden, expected.hidden_states[layer + 1][0], rtol=0, atol=0)
    vision = parameter_bytes(whole, "visual")
    assert parameter_bytes(whole) - parameter_bytes(target.model) == vision > 0


def test_the_reference_drafter_has_causal_sliding_layers_then_a_full_one(qwen36, tmp_path):
    shape = read_target_config(qwen36.target_dir).shape
    loaded = load_drafter(qwen36.reference_dir, shape)
    assert loaded.source.kind != "training-checkpoint"  # a published HF directory
    rules = [(a.kind, a.causal, a.window) for a in map(loaded.config.layer_attention, range(3))]
    window = REFERENCE.sliding_window
    assert rules == [
        ("sliding_attention", True, window),
        ("sliding_attention", True, window),
        ("full_attention", False, None),
    ]
    results = quick_run(qwen36, qwen36.target_dir, tmp_path, reference_drafter=qwen36.reference_dir)
    record = results["reference"]["drafter"]["attention"]
    assert [(r["kind"], r["causal"], r["window"]) for r in record] == rules
    # Really trained on this target: drafts are accepted (an untrained one scores 1).
    assert results["reference"]["metrics"]["tau_macro"] > 2


def test_lab_up_knows_the_content_by_name_and_names_all_on_a_typo():
    assert content_generator("qwen3.6") is qwen36_models
    with pytest.raises(LabError) as caught:
        content_generator("qwen3.7")
    assert str(caught.value) == (
        "unknown lab content 'qwen3.7'; expected one of 'random', 'models', 'qwen3.6'"
    )
