"""Per-set metrics with intervals, computed from per-prompt rows: the same numbers as the
run's own metrics, turns of a conversation resampled together, reproducible."""

from __future__ import annotations

import random

import pytest
from dflash_eval.contract import reading
from dflash_eval.walk.by_dataset import acceptance_counts, intervals
from dflash_eval.walk.metrics import PromptWalk, summarize


def row(
    prompt_id: str,
    dataset: str | None,
    lengths: list[int],
    slots: list[list[bool]],
    conversation: str | None = None,
) -> dict:
    """A per-prompt row as run/evaluate.py writes it, from a walk's round lengths and slots."""
    return {
        "id": prompt_id,
        "dataset": dataset,
        "conversation": conversation or prompt_id,
        "rounds": len(lengths),
        "tau": sum(lengths) / len(lengths) if lengths else None,
        "ddtree_tau": {"4": (sum(lengths) / len(lengths) + 0.5) if lengths else None},
        "acceptance": acceptance_counts(slots),
    }


def random_walk(rng: random.Random, block: int = 5) -> tuple[list[int], list[list[bool]]]:
    """Round lengths and slot correctness consistent with each other."""
    lengths, slots = [], []
    for _ in range(rng.randint(3, 12)):
        correct = [rng.random() < 0.7 for _ in range(block - 1)]
        accepted = next((k for k, ok in enumerate(correct) if not ok), block - 1)
        lengths.append(accepted + 1)
        slots.append(correct)
    return lengths, slots


@pytest.fixture
def rows() -> list[dict]:
    rng = random.Random(5)
    made = []
    for n in range(8):
        made.append(row(f"gsm8k-{n}", "gsm8k", *random_walk(rng)))
    for n in range(5):  # two turns per conversation
        made.append(row(f"mt-{n}#turn-1", "mt-bench", *random_walk(rng), f"mt-{n}#turn-1"))
        made.append(row(f"mt-{n}#turn-2", "mt-bench", *random_walk(rng), f"mt-{n}#turn-1"))
    made.append(row("empty", "gsm8k", [], []))  # no rounds: left out, as in `metrics`
    return made


def test_acceptance_counts_give_the_conditional_rates_the_metrics_give():
    rng = random.Random(1)
    walks = []
    for _ in range(6):
        lengths, slots = random_walk(rng)
        walks.append(PromptWalk(lengths=lengths, slot_correct=slots))
    expected = summarize(walks, block_size=5, budgets=[])["per_position"]
    counts = [acceptance_counts(walk.slot_correct) for walk in walks]
    for k, position in enumerate(expected):
        hits = sum(c["hits"][k] for c in counts)
        trials = sum(c["trials"][k] for c in counts)
        assert trials == position["conditional_rounds"]
        assert hits / trials == pytest.approx(position["conditional"])


def test_acceptance_counts_stop_at_the_first_wrong_slot():
    counts = acceptance_counts([[True, False, True], [False, True, True], [True, True]])
    assert counts == {"hits": [2, 1, 0], "trials": [3, 2, 0]}


def test_overall_values_are_the_runs_own_macro_pooled_and_acceptance(rows):
    block = intervals(rows, [4], resamples=300)
    overall = block["overall"]
    walked = [r for r in rows if r["rounds"]]
    macro = sum(r["tau"] for r in walked) / len(walked)
    pooled = sum(r["tau"] * r["rounds"] for r in walked) / sum(r["rounds"] for r in walked)
    assert overall["tau_macro"]["value"] == pytest.approx(macro)
    assert overall["tau_pooled"]["value"] == pytest.approx(pooled)
    tree = overall["ddtree"]["4"]["tau_macro"]
    assert tree["value"] == pytest.approx(macro + 0.5)
    first = overall["per_position"][0]["conditional"]
    hits = sum(r["acceptance"]["hits"][0] for r in walked)
    trials = sum(r["acceptance"]["trials"][0] for r in walked)
    assert first["value"] == pytest.approx(hits / trials)
    for interval in (overall["tau_macro"], overall["tau_pooled"], tree, first):
        assert interval["low"] <= interval["value"] <= interval["high"]
    assert overall["prompts"] == len(rows)
    assert overall["rounds"] == sum(r["rounds"] for r in walked)


def test_each_set_is_its_own_group_and_turns_are_resampled_together(rows):
    block = intervals(rows, [4], resamples=300)
    sets = block["datasets"]
    assert list(sets) == ["gsm8k", "mt-bench"]
    assert (sets["gsm8k"]["prompts"], sets["gsm8k"]["units"]) == (9, 8)
    assert (sets["mt-bench"]["prompts"], sets["mt-bench"]["units"]) == (
        10,
        5,
    )
    assert block["overall"]["units"] == 13
    gsm8k = [r for r in rows if r["dataset"] == "gsm8k" and r["rounds"]]
    assert sets["gsm8k"]["tau_macro"]["value"] == pytest.approx(
        sum(r["tau"] for r in gsm8k) / len(gsm8k)
    )
    assert block["bootstrap"] == {
        "method": "percentile",
        "unit": "conversation",
        "resamples": 300,
        "seed": 0,
        "level": 0.95,
    }


def test_the_block_is_the_same_every_time_and_changes_with_the_seed(rows):
    assert intervals(rows, [4], resamples=200) == intervals(rows, [4], resamples=200)
    assert intervals(rows, [4], resamples=200) != intervals(rows, [4], resamples=200, seed=9)


def test_a_set_of_one_conversation_has_values_without_bounds():
    rng = random.Random(2)
    rows = [
        row("mt-0#turn-1", "mt-bench", *random_walk(rng), "mt-0#turn-1"),
        row("mt-0#turn-2", "mt-bench", *random_walk(rng), "mt-0#turn-1"),
    ]
    group = intervals(rows, [])["datasets"]["mt-bench"]
    assert group["tau_macro"]["low"] is None
    assert reading.format_interval(group["tau_macro"]).endswith("[one unit: no interval]")


def test_prompts_without_a_set_count_overall_only():
    rng = random.Random(3)
    rows = [row(f"line-{n}", None, *random_walk(rng)) for n in range(4)]
    block = intervals(rows, [])
    assert block["datasets"] == {}
    assert block["overall"]["units"] == 4
