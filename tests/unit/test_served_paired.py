"""Served τ against CPU τ, paired per prompt: at T = 0 both are exact per prompt on the same
prompts, so the per-prompt differences (served − CPU in SGLang's count, matched by prompt id)
get a Student-t interval on their mean (contract/student.py, conversations as units); they
disagree when it excludes 0 and |mean| reaches the minimum effect. Records with nothing to
pair fall back to the overlap of the two intervals, and say so."""

from __future__ import annotations

import pytest

from dflash_ops.evaluation import results, served_agreement, served_records
from tests.unit.test_report import pull
from tests.unit.test_served_records import cpu_results, served

# Six single-turn prompts of 11 completion tokens: τ capped 2.0 is 5 rounds, 2.2 in SGLang's
# count (11 / 5), and so on.
CAPPED = (2.0, 2.5, 3.0, 4.0, 5.0, 2.0)
COUNTED = tuple(11 * tau / 10 for tau in CAPPED)  # 2.2, 2.75, 3.3, 4.4, 5.5, 2.2
SHIFTED = (0.08, 0.10, 0.12, 0.09, 0.11, 0.10)  # served a steady 0.1 above the CPU
NOISE = (0.3, -0.2, 0.1, -0.25, 0.2, -0.1)  # differences that average out


def cpu(conversations: tuple[str, ...] | None = None) -> dict:
    talks = conversations or tuple(f"p{i}" for i in range(len(CAPPED)))
    return {
        "per_prompt": [
            {"id": f"p{i}", "conversation": talk, "completion_tokens": 11, "tau_capped": tau}
            for i, (talk, tau) in enumerate(zip(talks, CAPPED, strict=True))
        ]
    }


def served_prompts(differences, conversations=None, ids=None) -> dict:
    talks = conversations or tuple(f"p{i}" for i in range(len(CAPPED)))
    names = ids or tuple(f"p{i}" for i in range(len(CAPPED)))
    return {
        "per_prompt": [
            {"id": name, "conversation": talk, "tau": value + delta}
            for name, talk, value, delta in zip(names, talks, COUNTED, differences, strict=True)
        ]
    }


def macros(delta: float) -> tuple[dict, dict]:
    """The two macro intervals, the served one the CPU's moved by `delta` (they overlap)."""
    cpu_macro = served_agreement.in_sglangs_count(cpu())["tau_macro"]
    return cpu_macro, {key: value + delta for key, value in cpu_macro.items()}


def test_a_steady_difference_the_overlap_test_accepts_is_a_paired_disagreement():
    cpu_macro, served_macro = macros(0.1)
    assert served_agreement.overlap(cpu_macro, served_macro)  # the lenient test passes it
    delta = served_agreement.paired_difference(cpu(), served_prompts(SHIFTED))
    # Mean 0.1; sd of the differences √(0.001 / 5); t(0.975, 5) = 2.5706: half 0.01484.
    assert delta == pytest.approx(
        {"value": 0.1, "low": 0.0851587, "high": 0.1148413, "prompts": 6, "units": 6}
    )
    judged = served_agreement.agreement(cpu(), served_prompts(SHIFTED), cpu_macro, served_macro)
    assert judged["test"] == served_agreement.PAIRED and judged["agree"] is False


def test_differences_within_the_noise_agree():
    cpu_macro, served_macro = macros(0.0)
    delta = served_agreement.paired_difference(cpu(), served_prompts(NOISE))
    assert delta == pytest.approx(
        {"value": 0.05 / 6, "low": -0.2273033, "high": 0.2439700, "prompts": 6, "units": 6}
    )
    judged = served_agreement.agreement(cpu(), served_prompts(NOISE), cpu_macro, served_macro)
    assert judged["test"] == served_agreement.PAIRED and judged["agree"] is True
    exact = served_agreement.agreement(cpu(), served_prompts((0.0,) * 6), cpu_macro, served_macro)
    assert abs(exact["delta_tau"]) < 1e-12 and exact["agree"] is True


@pytest.mark.parametrize(("steady", "agree"), [(0.02, True), (-0.04, True), (-0.06, False)])
def test_a_certain_difference_below_the_minimum_effect_agrees(steady, agree):
    cpu_macro, served_macro = macros(steady)
    prompts = served_prompts((steady,) * 6)
    judged = served_agreement.agreement(cpu(), prompts, cpu_macro, served_macro)
    low, high = judged["delta_low"], judged["delta_high"]
    assert low == pytest.approx(steady) and high == pytest.approx(steady)  # excludes 0
    assert judged["agree"] is agree


def test_turns_of_one_conversation_are_one_unit_of_the_interval():
    talks = ("a", "a", "b", "c", "c", "d")
    delta = served_agreement.paired_difference(cpu(talks), served_prompts(SHIFTED, talks))
    # The mean over the six prompts, its t interval over four units (delta method: sums per
    # unit 0.18, 0.12, 0.20, 0.10 over 2, 1, 2, 1 prompts; df 3).
    assert delta["value"] == pytest.approx(0.1) and delta["units"] == 4
    assert delta["low"] == pytest.approx(0.0826770) and delta["high"] == pytest.approx(0.1173230)


def test_nothing_to_pair_falls_back_to_overlap_and_says_so():
    cpu_macro, served_macro = macros(0.1)
    other = served_prompts(SHIFTED, ids=tuple(f"q{i}" for i in range(6)))
    assert served_agreement.paired_difference(cpu(), other) is None
    judged = served_agreement.agreement(cpu(), other, cpu_macro, served_macro)
    assert judged == {
        "agree": True,
        "test": served_agreement.OVERLAP,
        "delta_tau": None,
        "delta_low": None,
        "delta_high": None,
        "paired_prompts": 0,
    }


def test_compare_and_diagnose_say_which_test_found_the_disagreement(tmp_path):
    pull(tmp_path, 4000, 2.5)
    [run] = results.load_runs(tmp_path)
    counted = served_agreement.in_sglangs_count(run.done)["tau_macro"]
    rows = run.done["per_prompt"]
    steady = [
        {
            "id": row["id"],
            "conversation": row["conversation"],
            "prompt_tokens": 20,
            "completion_tokens": 64,
            "verify_steps": 20,
            "tau": 64 * row["tau_capped"] / 63 + 0.1 + (0.01 if i % 2 else -0.01),
        }
        for i, row in enumerate(rows)
    ]
    shifted = {key: value + 0.1 for key, value in counted.items()}
    assert served_agreement.overlap(counted, shifted)  # what the overlap test would accept
    served(tmp_path, "a-paired", 4000, 0, rows=steady, macro=shifted)
    served(tmp_path, "b-unpaired", 4000, counted["value"] + 0.1)  # no per-prompt values
    side = served_records.side_by_side([run], served_records.load_served(tmp_path))
    assert [(row["served_run"], row["test"], row["agree"]) for row in side] == [
        ("a-paired", "paired", False),
        ("b-unpaired", "overlap", True),
    ]
    assert side[0]["paired_prompts"] == 24 and side[0]["delta_tau"] == pytest.approx(0.1)
    cells = served_records.served_cells(side)
    assert cells[0][4].startswith("+0.100 [+0.09") and cells[0][5:7] == [
        "≠ no",
        "paired t, 24 prompts, |Δ| ≥ 0.05",
    ]
    assert cells[1][4:7] == ["–", "yes", "interval overlap (no per-prompt values)"]
    [finding] = served_records.served_findings(tmp_path, 4000, [])
    assert "a-paired" in finding["evidence"]
    assert "paired over 24 prompts, served − CPU = +0.100 [+0.09" in finding["evidence"]
    assert (
        "(Student-t 95 %): it excludes 0 and reaches the minimum effect of 0.05 τ"
        in (finding["evidence"])
    )
    lenient = dict(side[1], agree=False)
    assert (
        "no per-prompt values to pair, so the lenient overlap test was used"
        in (served_records.disagreement_finding(lenient, 1)["evidence"])
    )


@pytest.mark.parametrize(
    ("value", "low", "high", "disagree"),
    [
        (0.10, 0.05, 0.15, True),  # served above, beyond noise and the minimum
        (-0.10, -0.15, -0.05, True),  # served below
        (0.10, 0.0, 0.20, False),  # the interval reaches 0
        (-0.10, -0.20, 0.0, False),
        (0.10, -0.30, 0.50, False),  # a large mean within noise
        (0.05, 0.01, 0.09, True),  # exactly the minimum effect counts
        (0.0499, 0.01, 0.09, False),  # certain, but below it
        (-0.05, -0.09, -0.01, True),
        (0.30, None, None, False),  # one conversation: no interval, nothing to tell
        (0.30, None, 0.50, False),
        (0.30, 0.10, None, False),
    ],
)
def test_the_paired_verdict_at_its_bounds(value, low, high, disagree):
    assert served_agreement.disagrees({"value": value, "low": low, "high": high}) is disagree


def test_touching_intervals_overlap_and_prompts_without_a_round_are_not_counted():
    one = {"value": 1.0, "low": 0.5, "high": 1.0}
    other = {"value": 1.5, "low": 1.0, "high": 2.0}
    assert served_agreement.overlap(one, other) and served_agreement.overlap(other, one)
    apart = {"value": 1.5, "low": 1.01, "high": 2.0}
    assert not served_agreement.overlap(one, apart) and not served_agreement.overlap(apart, one)
    # a prompt with no round (τ capped absent) or a one-token completion has no rounds to
    # count; a two-token completion has one
    rows = cpu_results(("a", 2, 1.0), ("b", 5, None), ("c", 1, 1.0))
    counted = served_agreement.in_sglangs_count(rows)["tau_macro"]
    assert counted["value"] == pytest.approx(2.0)  # a alone: 2 tokens over 1 round
