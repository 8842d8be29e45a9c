"""The feature-noise signature: a drafter trained on noisy target features learns to read them
little, so zeroing them costs it far less τ than it costs the other drafter."""

from __future__ import annotations

import pytest
from dflash_eval.diagnose.signatures import feature_reliance


def diagnosis(mine: float, theirs: float, half_width: float = 0.1) -> dict:
    def lost(mean: float) -> dict:
        return {"mean": mean, "half_width": half_width, "prompts": 8}

    return {
        "against": "reference",
        "candidate": {"feature_reliance": lost(mine)},
        "other": {"feature_reliance": lost(theirs)},
    }


def test_a_drafter_that_owes_its_features_little_of_what_the_other_does_is_named():
    [found] = feature_reliance(diagnosis(0.3, 1.2))
    assert found["area"] == "features"
    assert "costs the candidate τ +0.30 ± 0.10 and reference τ +1.20" in found["evidence"]
    assert "25% as much" in found["evidence"]


@pytest.mark.parametrize(
    ("mine", "theirs", "half_width"),
    [
        (0.0, 0.0, 0.05),  # neither reads its features (the main lab's drafters)
        (0.0, 0.3, 0.3),  # the other's loss is within its interval
        (0.7, 1.2, 0.1),  # the candidate reads them more than half as much
    ],
)
def test_no_feature_claim_without_a_measured_difference_in_reliance(mine, theirs, half_width):
    assert feature_reliance(diagnosis(mine, theirs, half_width)) == []


def test_a_diagnosis_without_the_measurement_has_no_feature_claim():
    assert feature_reliance({"candidate": {}, "other": {}}) == []
