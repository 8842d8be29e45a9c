"""When no repair is a finding, diagnose says whether its prompts could have shown one: with
few prompts and many repairs, "nothing repairs" is a lack of evidence, not evidence."""

from __future__ import annotations

from dflash_eval.diagnose import repair_stats
from dflash_eval.diagnose.findings import nothing_repairs


def diagnosis(prompts: int, repairs: int) -> dict:
    tried = [
        {
            "label": f"repair {i}",
            "verdict": repair_stats.NO_EFFECT,
            "delta_tau": {"value": 0.02 * i, "low": -0.1, "high": 0.2},
            "gap_closed": None,
        }
        for i in range(repairs)
    ]
    return {
        "gap": {"mean": 1.0, "half_width": 0.3, "prompts": prompts},
        "repairs": {
            "prompts": prompts,
            "tried": tried,
            "detectable_sd": repair_stats.detectable_effect(prompts, repairs),
            "prompts_needed": repair_stats.prompts_needed(repairs),
        },
    }


def test_too_few_prompts_for_the_repairs_tried_is_said_with_the_prompts_needed():
    [found] = nothing_repairs(diagnosis(4, 20))
    assert "only a change of at least 3.7 standard deviations" in found["evidence"]
    assert "too few prompts to rule a repair out" in found["evidence"]
    needed = repair_stats.prompts_needed(20)
    assert found["check_next"].startswith(f"first run again with at least {needed} prompts")


def test_enough_prompts_say_nothing_about_their_count():
    [found] = nothing_repairs(diagnosis(40, 20))
    assert "standard deviations" not in found["evidence"]
    assert found["check_next"].startswith("the gap is in the weights")
