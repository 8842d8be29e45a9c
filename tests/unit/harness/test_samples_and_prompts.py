"""Decoded draft samples in the results, and asking for more prompts than exist."""

from __future__ import annotations

import itertools
import json

import pytest
from dflash_eval.contract.errors import HarnessError
from dflash_eval.target.files import load_tokenizer
from dflash_eval.walk.samples import sampled_prompts, typical_rounds

from .helpers import quick_eval


def test_results_keep_decoded_drafts_of_typical_rounds_token_by_token(lab, tmp_path):
    results = quick_eval(lab, tmp_path, num_prompts=4)
    samples = results["samples"]
    assert [s["id"] for s in samples] == ["lab-0", "lab-1", "lab-2"]  # plain prompts: the first
    tokenizer = load_tokenizer(lab.target_dir)
    for sample, row in zip(samples, results["per_prompt"], strict=False):
        rounds = sample["rounds"]
        assert 1 <= len(rounds) <= 4 and "dataset" not in sample
        completion = tokenizer(sample["completion_start"], add_special_tokens=False)["input_ids"]
        assert 0 < len(completion) <= min(4 * 8, row["completion_tokens"])
        for earlier, later in itertools.pairwise(rounds):
            assert later["position"] > earlier["position"]  # walk order
        for one in rounds:
            assert len(one["draft_tokens"]) == len(one["target_tokens"]) == 7  # B - 1 slots
            assert "".join(one["draft_tokens"]) == one["draft"]
            assert "".join(one["target_tokens"]) == one["target"]
            accepted = one["accepted"]
            assert one["draft_tokens"][:accepted] == one["target_tokens"][:accepted]
            assert accepted == 7 or one["draft_tokens"][accepted] != one["target_tokens"][accepted]
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["samples"] == samples


def test_samples_take_each_named_set_in_turn_and_the_quartile_rounds():
    assert sampled_prompts(["a", "a", "a", "b", "b", "c"]) == {0, 3, 5}
    assert sampled_prompts(["a", "a", "b"]) == {0, 2, 1}
    assert sampled_prompts([None] * 5) == {0, 1, 2}
    # Rounds of a prompt that starts hard: the quartiles, not the first four zeros.
    accepted = [0, 0, 0, 0, 3, 5, 2, 7, 4, 3, 6, 2]
    chosen = typical_rounds(accepted)
    assert chosen == sorted(chosen) and len(chosen) == 4
    assert sorted(accepted[i] for i in chosen) == [0, 2, 3, 6]
    assert typical_rounds([1, 0]) == [0, 1] and typical_rounds([]) == []


def test_more_prompts_than_exist_is_an_error(lab, tmp_path):
    with pytest.raises(HarnessError) as caught:
        quick_eval(lab, tmp_path, num_prompts=50)
    message = str(caught.value)
    assert "--num-prompts 50" in message and "(8)" in message and str(lab.prompts) in message
    with pytest.raises(HarnessError, match="built-in set holds \\(10\\)"):
        quick_eval(lab, tmp_path, prompts=None, num_prompts=11)
    assert len(quick_eval(lab, tmp_path, num_prompts=8, max_new_tokens=4)["per_prompt"]) == 8
