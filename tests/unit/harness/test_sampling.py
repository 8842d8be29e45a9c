"""T > 0: the probabilities, the exact walk, its Monte Carlo check, a sampled run's record.

The proof that the offline estimate measures what a live decode gets is in
tests/long/test_sampling_live_mean.py and test_sampling_unbiased.py (modules of their own: each
takes minutes, and parallel workers run them side by side).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics

import pytest
import torch
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.reading import comparability_key, overall_interval
from dflash_eval.contract.schema_check import parse_results
from dflash_eval.contract.summary import summary_lines
from dflash_eval.run.options import EvalOptions
from dflash_eval.walk.metrics import Span
from dflash_eval.walk.sampled import WalkRule, expected_walk, summarize_sampled, walk_sampled
from dflash_eval.walk.sampling import processed_probs
from dflash_eval.walk.sampling_settings import Sampling, from_options

from .helpers import quick_eval
from .live_loops import Settings, plain_probs
from .sampling_parts import MAX_NEW_TOKENS


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"),
    [(0.7, 1.0, 0), (1.3, 0.9, 0), (0.8, 1.0, 10), (1.0, 0.8, 12), (0.5, 0.3, 5), (1.0, 1e-4, 0)],
)
def test_processed_probabilities_match_a_plain_implementation(temperature, top_p, top_k):
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1)) * 3
    ours = processed_probs(logits, Sampling(temperature, top_p, top_k))
    plain = plain_probs(logits, Settings(temperature, top_p, top_k))
    assert torch.allclose(ours, plain, atol=1e-6)
    assert torch.allclose(ours.sum(dim=-1), torch.ones(6))
    if top_p < 1e-3:  # the likeliest token is always kept, whatever top_p
        assert torch.equal(ours.argmax(dim=-1), logits.argmax(dim=-1))
        assert torch.allclose(ours.max(dim=-1).values, torch.ones(6))


def enumerated(table: torch.Tensor, rule: WalkRule) -> tuple[float, float, float]:
    """(E[tokens/rounds], E[rounds], E[tokens]) by listing every accept/reject outcome of
    every slot of every round (slots after a rejection are drawn too and sum out)."""
    ratios = table.nan_to_num(0.0).tolist()
    totals = [0.0, 0.0, 0.0]

    def go(anchor: int, rounds: int, chance: float) -> None:
        if rounds and (rule.ended(anchor) or rounds == rule.max_rounds):
            committed = anchor - rule.first
            for i, value in enumerate((committed / rounds, rounds, committed)):
                totals[i] += chance * value
            return
        row = ratios[anchor - rule.first]
        for outcome in itertools.product((True, False), repeat=len(row)):
            weight = math.prod(r if ok else 1 - r for r, ok in zip(row, outcome, strict=True))
            if weight == 0:
                continue
            length = next((k for k, ok in enumerate(outcome) if not ok), len(row)) + 1
            if rule.cap is not None:
                length = min(length, rule.cap - anchor)
            go(anchor + length, rounds + 1, chance * weight)

    go(rule.first, 0, 1.0)
    return totals[0], totals[1], totals[2]


@pytest.mark.parametrize(
    "rule",
    [
        WalkRule(10, 17),
        WalkRule(10, 17, stop=13),
        WalkRule(10, 16, cap=16),
        WalkRule(10, 17, max_rounds=3),
        WalkRule(10, 17, stop=15, max_rounds=4),
    ],
)
def test_exact_walk_equals_the_enumeration_of_every_outcome(rule):
    generator = torch.Generator().manual_seed(3)
    table = torch.rand(7, 3, generator=generator, dtype=torch.float64)
    table[2, 1] = 1.0  # a slot the drafter always gets
    table[4, 0] = 0.0  # and one it never does
    table[-1, 1:] = math.nan  # past the known path
    table[-2, 2:] = math.nan
    exact = expected_walk(table, rule)
    tau, rounds, tokens = enumerated(table, rule)
    assert exact.tau == pytest.approx(tau, rel=1e-12)
    assert exact.rounds == pytest.approx(rounds, rel=1e-12)
    assert exact.tokens == pytest.approx(tokens, rel=1e-12)
    assert sum(exact.histogram) == pytest.approx(rounds, rel=1e-12)


def test_certain_and_impossible_acceptance_give_the_greedy_lengths():
    span = Span(first_anchor=5, limit=25)
    sampling = Sampling(1.0, samples=10)
    rng = torch.Generator().manual_seed(0)
    always = walk_sampled(torch.ones(20, 7, dtype=torch.float64), span, 40, sampling, rng)
    never = walk_sampled(torch.zeros(20, 7, dtype=torch.float64), span, 40, sampling, rng)
    assert always.main.tau == 8 and always.main.rounds == 3  # 3 full blocks pass the limit
    assert always.capped.rounds == 3 and always.capped.tokens == 19  # the last one capped
    assert never.main.tau == 1 and never.main.rounds == 20
    assert set(always.mc_rounds) == {3} and set(never.mc_tokens) == {20}


def test_monte_carlo_interval_covers_the_exact_expectation():
    generator = torch.Generator().manual_seed(5)
    sampling = Sampling(1.0, samples=4000, seed=5, paths=1)
    walks = [
        walk_sampled(
            torch.rand(30, 5, generator=generator, dtype=torch.float64) ** 0.5,
            Span(first_anchor=4, limit=34, stop=30 if n else None),
            44,
            sampling,
            torch.Generator().manual_seed(n),
        )
        for n in range(3)
    ]
    metrics = summarize_sampled(walks, 6, sampling, [(str(n), str(n)) for n in range(3)])
    carlo = metrics["sampling"]["monte_carlo"]
    assert carlo["tau_macro"]["low"] <= metrics["tau_macro"] <= carlo["tau_macro"]["high"]
    # Rounds and tokens are linear: their Monte Carlo means agree with the expectations.
    # (Pooled τ is not: the exact figure is Σ E[tokens] / Σ E[rounds], the Monte Carlo one
    # the mean of Σ tokens / Σ rounds; they differ by a few % over so few rounds.)
    for walked in walks:
        for drawn, exact in (
            (walked.mc_rounds, walked.main.rounds),
            (walked.mc_tokens, walked.main.tokens),
        ):
            error = statistics.stdev(drawn) / math.sqrt(len(drawn))
            assert abs(statistics.mean(drawn) - exact) < 4 * error
    assert metrics["sampling"]["temperature"] == 1.0 and metrics["ddtree"] == {}


def test_bad_sampling_options_stop_the_run_with_one_line(tmp_path):
    def options(**values):
        return EvalOptions(
            checkpoint=tmp_path / "c", target=tmp_path / "t", out=tmp_path / "r.json", **values
        )

    with pytest.raises(
        HarnessError, match=r"--top-p: expected a finite number > 0 and ≤ 1, found 1.5"
    ):
        from_options(options(temperature=1.0, top_p=1.5))
    with pytest.raises(HarnessError, match="need --temperature above 0"):
        from_options(options(top_k=5))
    with pytest.raises(HarnessError, match="omit --sglang-url"):
        from_options(options(temperature=0.5, sglang_url="http://127.0.0.1:1"))
    with pytest.raises(HarnessError, match="omit --features"):
        from_options(options(temperature=0.5, features=tmp_path))
    assert not from_options(options()).active


def test_sampled_evaluation_records_its_settings_and_is_reproducible(lab, tmp_path):
    settings = {"temperature": 8.0, "top_p": 0.95, "top_k": 40, "samples": 200}
    first = quick_eval(lab, tmp_path, **settings, max_new_tokens=MAX_NEW_TOKENS)
    again = quick_eval(lab, tmp_path, **settings, max_new_tokens=MAX_NEW_TOKENS)
    other = quick_eval(lab, tmp_path, **settings, seed=1, max_new_tokens=MAX_NEW_TOKENS)
    _check_paths(
        first, quick_eval(lab, tmp_path, **settings, paths=1, max_new_tokens=MAX_NEW_TOKENS)
    )
    metrics = first["metrics"]
    assert metrics["sampling"]["seed"] == 0 and metrics["sampling"]["top_k"] == 40
    assert first["completions"]["source"] == "local-sampled"
    assert first["features"]["cache"]["completion_hits"] == 0
    # Keyed by settings, seed and path: 3 prompts × the default 4 paths.
    assert again["features"]["cache"]["completion_hits"] == 3 * 4
    assert again["metrics"] == metrics
    assert other["metrics"]["tau_macro"] != metrics["tau_macro"]
    taus = [row["tau"] for row in first["per_prompt"]]
    assert metrics["tau_macro"] == pytest.approx(sum(taus) / len(taus))
    assert 1 < metrics["tau_macro"] < 8
    written = parse_results(json.loads((tmp_path / "r.json").read_text()))  # `other`'s file
    assert written["metrics"]["sampling"]["monte_carlo"]["tau_macro"] is not None
    assert isinstance(written["per_prompt"][0]["rounds"], float)
    # The seed does not keep runs apart; the settings do, and T = 0 is a setting of its own.
    assert comparability_key(other) == comparability_key(first)
    assert comparability_key(first)["sampling"] == (8.0, 0.95, 40)


def _check_paths(first, one):
    """`first` ran with the default 4 paths, `one` with 1, on the same 3 prompts."""
    metrics, rows = first["metrics"], first["per_prompt"]
    assert metrics["sampling"]["paths"] == 4 and len(rows) == 3
    for row in rows:
        assert len(row["path_tau"]) == 4 and len(set(row["path_tau"])) > 1  # distinct paths
        assert row["tau"] == pytest.approx(statistics.mean(row["path_tau"]))
    interval = metrics["sampling"]["interval"]
    assert interval["units"] == 3 and interval["paths"] == 4
    assert interval["tau_macro"]["value"] == pytest.approx(metrics["tau_macro"])
    assert interval["tau_macro"]["low"] < metrics["tau_macro"] < interval["tau_macro"]["high"]
    assert interval["tau_pooled"]["value"] == pytest.approx(metrics["tau_pooled"])
    assert interval["warning"].startswith("3 prompts (conversations): too few")
    assert overall_interval(first) == interval["tau_macro"]  # what compare and watch show
    lines = summary_lines(first)
    assert any("Student-t over 3 prompt means, 4 sampled paths each" in line for line in lines)
    assert any(line.strip().startswith("WARNING: 3 prompts") for line in lines)
    # The first path is the one runs before --paths sampled: one path reuses its cache.
    assert one["features"]["cache"]["completion_hits"] == 3
    assert [r["path_tau"] for r in one["per_prompt"]] == [r["path_tau"][:1] for r in rows]
    assert 0.5 < one["metrics"]["rounds"] / metrics["rounds"] < 2  # per prompt set, not × paths
    # A record from before --paths still reads, and its summary has no interval line.
    old = json.loads(json.dumps(first))
    del old["metrics"]["sampling"]["paths"], old["metrics"]["sampling"]["interval"]
    for row in old["per_prompt"]:
        del row["path_tau"]
    assert not any("Student-t" in line for line in summary_lines(parse_results(old)))
