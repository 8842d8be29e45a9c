"""T > 0, more sharply: the harness's offline expectation averaged over many sampled paths
must agree with the live loop's mean (live_loops.py) within their combined standard error."""

from __future__ import annotations

import math
import statistics

import pytest
from dflash_eval.contract.prompts import read_prompts_jsonl
from dflash_eval.reference.conversation import encode_prompt

from tests.unit.harness.live_loops import live_sampled_lengths
from tests.unit.harness.sampling_parts import (
    MAX_NEW_TOKENS,
    SETTINGS,
    lab_parts,
    path_expectation,
)

pytestmark = pytest.mark.long(90)  # seconds in a cold `make test` (5 workers)


def test_offline_expectation_is_unbiased_for_the_live_loop(lab):
    """The live τ of one prompt over 300 seeds against the harness's exact expectation
    averaged over 150 sampled paths: the same mean, within 4 combined standard errors."""
    parts = lab_parts(lab)
    _, tokenizer, _, live, stops = parts
    prompt = read_prompts_jsonl(lab.prompts)[1]
    prompt_ids = encode_prompt(tokenizer, prompt)[0]
    live_taus = [
        statistics.mean(
            live_sampled_lengths(live, prompt_ids, MAX_NEW_TOKENS, stops, SETTINGS, s)[1]
        )
        for s in range(300)
    ]
    offline_taus = [path_expectation(parts, prompt, prompt_ids, seed).tau for seed in range(150)]
    error = math.hypot(
        statistics.stdev(live_taus) / math.sqrt(len(live_taus)),
        statistics.stdev(offline_taus) / math.sqrt(len(offline_taus)),
    )
    assert abs(statistics.mean(live_taus) - statistics.mean(offline_taus)) < 4 * error
    assert statistics.mean(live_taus) > 1.1  # the drafter gets drafts accepted at T > 0
