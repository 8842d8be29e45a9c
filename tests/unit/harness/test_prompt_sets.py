"""Named prompt sets in the harness: the JSONL records the workstation writes (set, source,
multi-turn "turns"), turns asked after the target's own replies, `--thinking`, and the
per-set results with intervals, on the lab's tiny models."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from dflash_eval.contract import reading
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.prompts import Prompt, builtin_prompts, prompts_hash, read_prompts_jsonl
from dflash_eval.contract.summary import summary_lines
from dflash_eval.reference.conversation import Conversations

from tests.unit.harness.helpers import quick_eval

SOURCE = {"repo": "openai/gsm8k", "revision": "0123456789abcdef", "seed": 0}
# A template with a thinking switch, in the shape of Qwen3's (which adds an empty think
# block when thinking is off).
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}: {{ m.content }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant: "
    "{% if not enable_thinking %}[no think] {% endif %}{% endif %}"
)


def write_sets(path: Path) -> Path:
    records = [
        {"id": "gsm8k-3", "dataset": "gsm8k", "source": SOURCE, "prompt": "the quick brown fox"},
        {"id": "gsm8k-1", "dataset": "gsm8k", "source": SOURCE, "prompt": "def add(a, b):"},
        {"id": "gsm8k-7", "dataset": "gsm8k", "source": SOURCE, "prompt": "x = [i * i for"},
        {
            "id": "mt-bench-0",
            "dataset": "mt-bench",
            "source": {"repo": "HuggingFaceH4/mt_bench_prompts"},
            "turns": ["Why is the sky blue?", "print('hello, world')"],
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def templated_target(lab, directory: Path) -> Path:
    """A copy of the lab target whose tokenizer has a chat template with a thinking switch."""
    shutil.copytree(lab.target_dir, directory)
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = THINKING_TEMPLATE
    config_file.write_text(json.dumps(config))
    return directory


def test_records_with_turns_become_one_prompt_per_turn_each_following_the_last(tmp_path):
    prompts = read_prompts_jsonl(write_sets(tmp_path / "sets.jsonl"))
    assert [p.id for p in prompts] == [
        "gsm8k-3", "gsm8k-1", "gsm8k-7", "mt-bench-0#turn-1", "mt-bench-0#turn-2",
    ]  # fmt: skip
    first, second = prompts[3], prompts[4]
    assert (first.follows, second.follows) == (None, "mt-bench-0#turn-1")
    assert second.messages == (("user", "print('hello, world')"),)
    assert {p.dataset for p in prompts} == {"gsm8k", "mt-bench"}
    assert prompts[0].source == SOURCE


@pytest.mark.parametrize(
    "record",
    [{"turns": []}, {"turns": ["ok", 3]}, {"prompt": "x", "dataset": 5}],
)
def test_malformed_set_records_are_refused_with_their_line(tmp_path, record):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(HarnessError, match=r"bad.jsonl:2 is not a prompt"):
        read_prompts_jsonl(path)


def test_plain_prompts_hash_as_before_and_a_set_name_changes_the_hash():
    plain = builtin_prompts()
    before = json.dumps([[p.id, p.messages] for p in plain], ensure_ascii=False)
    assert prompts_hash(plain) == hashlib.sha256(before.encode()).hexdigest()
    tagged = [Prompt(p.id, p.messages, dataset="gsm8k") for p in plain]
    assert prompts_hash(tagged) != prompts_hash(plain)


def test_a_later_turn_is_asked_after_the_first_and_the_targets_reply(lab, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(templated_target(lab, tmp_path / "target"))
    first = Prompt("c#turn-1", (("user", "Why?"),), "mt-bench")
    second = Prompt("c#turn-2", (("user", "And then?"),), "mt-bench", follows="c#turn-1")
    conversations = Conversations(tokenizer, thinking=False, reply_tokens=5)
    with pytest.raises(HarnessError, match="must come in order"):
        conversations.encode(second)
    conversations.encode(first)
    reply = tokenizer("because<|im_end|>tail")["input_ids"]  # cut at 5 tokens: "becau"
    conversations.replied(first, reply)
    asked = tokenizer.decode(conversations.encode(second))
    assert asked == (
        "<|im_start|>user: Why?<|im_end|><|im_start|>assistant: becau<|im_end|>"
        "<|im_start|>user: And then?<|im_end|><|im_start|>assistant: [no think] "
    )
    assert conversations.first_turn(second) == "c#turn-1"
    # At T > 0 each sampled path has its own history: path 1 follows path 1's reply.
    with pytest.raises(HarnessError, match="must come in order"):
        conversations.encode(second, path=1)
    conversations.encode(first, path=1)
    conversations.replied(first, tokenizer("other")["input_ids"], path=1)
    assert "assistant: other" in tokenizer.decode(conversations.encode(second, path=1))
    assert "assistant: becau" in tokenizer.decode(conversations.encode(second))


def test_sets_give_per_set_results_with_intervals_and_their_sources(lab, tmp_path):
    results = quick_eval(
        lab, tmp_path, prompts=write_sets(tmp_path / "sets.jsonl"), num_prompts=None
    )
    rows = {row["id"]: row for row in results["per_prompt"]}
    turn1, turn2 = rows["mt-bench-0#turn-1"], rows["mt-bench-0#turn-2"]
    # The second turn's prompt holds the first turn, the target's reply and its own question.
    assert turn2["prompt_tokens"] > turn1["prompt_tokens"] + turn1["completion_tokens"]
    assert turn2["conversation"] == "mt-bench-0#turn-1"
    assert rows["gsm8k-1"]["dataset"] == "gsm8k"
    block = results["by_dataset"]
    assert set(block["datasets"]) == {"gsm8k", "mt-bench"}
    overall = block["overall"]
    assert overall["tau_macro"]["value"] == pytest.approx(results["metrics"]["tau_macro"])
    assert overall["tau_pooled"]["value"] == pytest.approx(results["metrics"]["tau_pooled"])
    assert (overall["prompts"], overall["units"]) == (5, 4)
    with_intervals = {p["position"]: p["conditional"] for p in overall["per_position"]}
    for position, rate in reading.conditional_by_position(results["metrics"]).items():
        if rate is not None:
            assert with_intervals[position]["value"] == pytest.approx(rate)
    sets = results["prompts"]["datasets"]
    assert sets["gsm8k"]["count"] == 3
    assert sets["gsm8k"]["source"] == SOURCE
    assert sets["mt-bench"]["count"] == 2
    assert results["prompts"]["thinking"] == "off"
    summary = "\n".join(summary_lines(results))
    assert "gsm8k (3 prompts): τ macro" in summary
    assert "gsm8k 3: openai/gsm8k@0123456789ab" in summary


def test_thinking_reaches_the_chat_template_and_is_recorded(lab, tmp_path):
    target = templated_target(lab, tmp_path / "target")
    off = quick_eval(lab, tmp_path / "off", target=target, num_prompts=2)
    on = quick_eval(lab, tmp_path / "on", target=target, num_prompts=2, thinking=True)
    marker = len("[no think] ")  # one token per character in the lab's tokenizer
    for without, with_ in zip(off["per_prompt"], on["per_prompt"], strict=True):
        assert without["prompt_tokens"] == with_["prompt_tokens"] + marker
    assert (off["prompts"]["thinking"], on["prompts"]["thinking"]) == (
        "off",
        "on",
    )
    assert on["prompts"]["template_reads_thinking"] is True
    assert reading.comparability_key(on)["thinking"] != reading.comparability_key(off)["thinking"]
    assert not any("thinking" in warning for warning in on["warnings"])


def test_thinking_on_a_template_without_the_switch_is_a_recorded_warning(lab, tmp_path):
    results = quick_eval(lab, tmp_path, num_prompts=1, max_new_tokens=16, thinking=True)
    assert results["prompts"]["template_reads_thinking"] is False
    assert any("no thinking switch" in warning for warning in results["warnings"])
