"""T > 0: the interval covers at its level. On the lab's models, a pool of sampled paths per
prompt, each with the exact E[τ | path] the harness computes, is the world; the truth is the
mean over prompts of the pool's per-prompt means (the live loop's mean, up to the pool's own
noise: test_sampling_unbiased.py shows that the mean of E[τ | path] over paths is the live
loop's). Many replicate runs draw `PATHS` paths per prompt from the pool: the Student-t
interval (contract/student.py) must hold the truth about 95 % of the times, and the interval the
harness gave before --paths (a percentile bootstrap over prompts of one path each) must not,
so that this test can fail. docs/sampling.md gives the figure measured against the live loop
directly, with fresh paths and the live loop's own many-seed means."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from dflash_eval.contract.bootstrap import Bootstrap
from dflash_eval.contract.prompts import read_prompts_jsonl
from dflash_eval.contract.student import PathValue, prompt_interval
from dflash_eval.reference.conversation import encode_prompt

from tests.unit.harness.sampling_parts import lab_parts, path_expectation

pytestmark = pytest.mark.long(35)  # seconds in a cold `make test` (5 workers)

PROMPTS = 5  # the fewest the interval is not warned about
POOL = 24  # sampled paths per prompt
PATHS = 4  # paths per prompt in a replicate run (the default of --paths)
REPLICATES = 1000
OLD_REPLICATES = 300  # the bootstrap is slower, and far off


def _band(replicates: int) -> tuple[float, float]:
    """95 % − 3 binomial standard errors, up to 98.5 %: over a fixed prompt set the interval
    is somewhat conservative by design (the spread of the prompt means holds the differences
    between prompts too; here it covered 96.6 %)."""
    return 0.95 - 3 * math.sqrt(0.95 * 0.05 / replicates), 0.985


def test_the_interval_covers_the_live_loops_mean_at_its_level(lab):
    parts = lab_parts(lab)
    tokenizer = parts[1]
    prompts = read_prompts_jsonl(lab.prompts)[:PROMPTS]
    pool = [
        [path_expectation(parts, p, encode_prompt(tokenizer, p)[0], seed) for seed in range(POOL)]
        for p in prompts
    ]
    assert all(len({e.tau for e in paths}) > POOL // 2 for paths in pool)  # paths differ
    truth = statistics.mean(statistics.mean(e.tau for e in paths) for paths in pool)
    rng = random.Random(0)

    covered = 0
    for _ in range(REPLICATES):
        values = [
            PathValue(str(i), str(i), e.tau, e.tokens, e.rounds)
            for i, paths in enumerate(pool)
            for e in rng.sample(paths, PATHS)
        ]
        interval = prompt_interval(values, PATHS)
        assert interval["warning"] is None
        covered += interval["tau_macro"]["low"] <= truth <= interval["tau_macro"]["high"]
    low, high = _band(REPLICATES)
    assert low <= covered / REPLICATES <= high, covered

    old_covered = 0
    for replicate in range(OLD_REPLICATES):
        taus = [rng.choice(paths).tau for paths in pool]
        old = Bootstrap(PROMPTS, seed=replicate).ratio(taus, [1.0] * PROMPTS)
        old_covered += old.low <= truth <= old.high
    assert old_covered / OLD_REPLICATES < _band(OLD_REPLICATES)[0], old_covered
