"""Decoded draft samples in the results, and asking for more prompts than exist."""

from __future__ import annotations

import itertools
import json

import pytest
from dflash_eval.errors import HarnessError
from dflash_eval.target import load_tokenizer

from .helpers import quick_eval


def test_results_keep_decoded_drafts_of_the_first_prompts(lab, tmp_path):
    results = quick_eval(lab, tmp_path, num_prompts=4)
    samples = results["samples"]
    assert [s["id"] for s in samples] == ["lab-0", "lab-1", "lab-2"]
    tokenizer = load_tokenizer(lab.target_dir)
    for sample, row in zip(samples, results["per_prompt"], strict=False):
        rounds = sample["rounds"]
        assert 1 <= len(rounds) <= 4
        assert rounds[0]["position"] == 0
        completion = tokenizer(sample["completion_start"], add_special_tokens=False)["input_ids"]
        assert 0 < len(completion) <= min(4 * 8, row["completion_tokens"])
        for earlier, later in itertools.pairwise(rounds):
            assert later["position"] == earlier["position"] + earlier["accepted"] + 1
        for one in rounds:
            draft = tokenizer(one["draft"], add_special_tokens=False)["input_ids"]
            truth = tokenizer(one["target"], add_special_tokens=False)["input_ids"]
            assert len(draft) == len(truth) == 7  # B - 1 slots
            accepted = one["accepted"]
            assert draft[:accepted] == truth[:accepted]
            assert accepted == 7 or draft[accepted] != truth[accepted]
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["samples"] == samples


def test_more_prompts_than_exist_is_an_error(lab, tmp_path):
    with pytest.raises(HarnessError) as caught:
        quick_eval(lab, tmp_path, num_prompts=50)
    message = str(caught.value)
    assert "--num-prompts 50" in message and "(8)" in message and str(lab.prompts) in message
    with pytest.raises(HarnessError, match="built-in set holds \\(10\\)"):
        quick_eval(lab, tmp_path, prompts=None, num_prompts=11)
    assert len(quick_eval(lab, tmp_path, num_prompts=8, max_new_tokens=4)["per_prompt"]) == 8
