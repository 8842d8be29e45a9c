"""T > 0, the live loop against the harness: live_loops.py's rejection-sampling loop (written
from z-lab's reference, sharing nothing with the harness but the drafter's forward) run over
many seeds must have its mean τ inside the harness's interval (metrics.sampling.interval)."""

from __future__ import annotations

import statistics

import pytest
from dflash_eval.contract.prompts import read_prompts_jsonl
from dflash_eval.reference.conversation import encode_prompt

from tests.unit.harness.helpers import quick_eval
from tests.unit.harness.live_loops import live_sampled_lengths
from tests.unit.harness.sampling_parts import MAX_NEW_TOKENS, SETTINGS, lab_parts

pytestmark = pytest.mark.long(65)  # seconds in a cold `make test` (5 workers)


def test_live_loop_mean_falls_in_the_harness_interval(lab, tmp_path):
    results = quick_eval(
        lab,
        tmp_path,
        temperature=SETTINGS.temperature,
        top_p=SETTINGS.top_p,
        top_k=SETTINGS.top_k,
        num_prompts=8,
        max_new_tokens=MAX_NEW_TOKENS,
        samples=20,
        paths=1,  # the test's cost as before --paths: the t interval holds for one path too
    )
    interval = results["metrics"]["sampling"]["interval"]["tau_macro"]
    _, tokenizer, _, live, stops = lab_parts(lab)
    prompts = [encode_prompt(tokenizer, p)[0] for p in read_prompts_jsonl(lab.prompts)[:8]]
    runs = [
        statistics.mean(
            statistics.mean(live_sampled_lengths(live, ids, MAX_NEW_TOKENS, stops, SETTINGS, s)[1])
            for ids in prompts
        )
        for s in range(40)
    ]
    assert interval["low"] <= statistics.mean(runs) <= interval["high"]
