"""Eval options: reference drafter, per-block predictor, bf16, max blocks, prompts, configs."""

from __future__ import annotations

import json

import pytest
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.prompts import Prompt, read_prompts_jsonl
from dflash_eval.drafter.config import from_hf_dict
from dflash_eval.reference.conversation import encode_prompt
from dflash_eval.target.files import load_tokenizer

from .helpers import quick_eval


def test_reference_drafter_is_evaluated_on_the_same_hidden_states(lab, tmp_path):
    results = quick_eval(lab, tmp_path, reference_drafter=lab.checkpoints[2000])
    ours, theirs = results["metrics"], results["reference"]["metrics"]
    assert results["reference"]["checkpoint"]["step"] == 2000
    # Same completions: the capped walks commit the same tokens (the z-lab walks may not,
    # their last rounds run past the end by different amounts).
    assert theirs["capped"]["committed_tokens"] == ours["capped"]["committed_tokens"]
    assert results["reference"]["samples"][0]["id"] == results["samples"][0]["id"]
    assert results["comparison"]["tau_macro"] == ours["tau_macro"] / theirs["tau_macro"] > 1
    assert "reference_drafter" in results["timings_s"]
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["comparison"] == results["comparison"]


def test_per_block_predictor_gives_the_same_metrics(lab, tmp_path):
    batched = quick_eval(lab, tmp_path)
    per_block = quick_eval(lab, tmp_path, per_block=True)
    assert per_block["harness"]["predictor"] == "per-block"
    assert per_block["metrics"] == batched["metrics"]


def test_bfloat16_drafter_runs_and_stays_close(lab, tmp_path):
    fp32 = quick_eval(lab, tmp_path)["metrics"]["tau_macro"]
    bf16 = quick_eval(lab, tmp_path, dtype="bfloat16")["metrics"]["tau_macro"]
    assert abs(bf16 - fp32) < 0.25 * fp32


def test_max_blocks_caps_rounds_per_prompt(lab, tmp_path):
    results = quick_eval(lab, tmp_path, max_blocks=5)
    assert [row["rounds"] for row in results["per_prompt"]] == [5, 5, 5]
    assert results["metrics"]["rounds"] == 15


def test_bad_options_are_explained(lab, tmp_path):
    with pytest.raises(HarnessError, match="--num-prompts"):
        quick_eval(lab, tmp_path, num_prompts=0)
    with pytest.raises(HarnessError, match="--ddtree"):
        quick_eval(lab, tmp_path, ddtree=[0])
    with pytest.raises(HarnessError, match="--prompts"):
        quick_eval(lab, tmp_path, prompts=tmp_path / "nope.jsonl")


def test_prompts_jsonl_formats_and_errors(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "a"}\n\n{"id": "m", "messages": [{"role": "user", "content": "b"}]}\n'
    )
    prompts = read_prompts_jsonl(path)
    assert [p.id for p in prompts] == ["line-1", "m"]
    assert prompts[1].messages == (("user", "b"),)
    path.write_text('{"prompt": 3}\n')
    with pytest.raises(HarnessError, match=r"p\.jsonl:1"):
        read_prompts_jsonl(path)


def test_chat_template_is_applied_with_thinking_disabled(lab):
    tokenizer = load_tokenizer(lab.target_dir)
    prompt = Prompt("t", (("user", "hi"),))
    plain, used = encode_prompt(tokenizer, prompt)
    assert not used and tokenizer.decode(plain) == "hi"
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<a>{% endif %}"
        "{% if enable_thinking is defined and not enable_thinking %}(nothink){% endif %}"
    )
    ids, used = encode_prompt(tokenizer, prompt)
    assert used and tokenizer.decode(ids) == "<user>hi<a>(nothink)"


def test_unsupported_drafter_features_are_refused():
    base = {
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }
    assert from_hf_dict(base, "x").head_dim == 4
    for extra in (
        {"attention_bias": True},
        {"rope_scaling": {"rope_type": "made-up", "factor": 4.0}},
    ):
        with pytest.raises(HarnessError, match="does not implement"):
            from_hf_dict({**base, **extra}, "x")


def test_unwritable_output_is_reported_before_thequick_eval(lab, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(HarnessError, match="--out: cannot write"):
        quick_eval(lab, tmp_path, out=blocker / "sub" / "r.json")


def test_target_without_config_is_explained(lab, tmp_path):
    with pytest.raises(HarnessError, match=r"has no config\.json"):
        quick_eval(lab, tmp_path, target=tmp_path)
