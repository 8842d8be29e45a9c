"""`diagnose` on the context lab's training-side faults (dflash_lab/faulty.py): an `fc` trained
with the loss layer among its feature layers is repaired by that layer; a drafter trained on
noisy features is found to hardly read them. The drafters are cached beside the context lab;
each diagnosis measures every repair (about a minute on a loaded machine)."""

from __future__ import annotations

import pytest
from dflash_eval.contract.diagnose_summary import summary_lines

from dflash_lab.content import MODEL_CACHE
from dflash_lab.context_models import DRAFTER_STEP, build_context_lab
from dflash_lab.faulty import build_faulty_drafter
from dflash_lab.models import LabModels
from tests.unit.harness.helpers import diagnose_lab

pytestmark = pytest.mark.long(60)  # seconds with 4 workers, each diagnosis


@pytest.fixture(scope="module")
def context_lab() -> LabModels:
    return build_context_lab(MODEL_CACHE)


def test_a_drafter_trained_with_the_loss_layer_among_its_features_is_repaired_by_it(
    context_lab, tmp_path
):
    candidate = build_faulty_drafter(context_lab, "loss-layer")
    reference = context_lab.checkpoints[DRAFTER_STEP]
    diagnosis = diagnose_lab(context_lab, tmp_path, candidate, reference)
    top = diagnosis["findings"][0]
    assert top["area"] == "repair", summary_lines(diagnosis)
    assert top["title"].startswith("the loss layer 5"), summary_lines(diagnosis)
    assert "target_layer_ids = [1, 5]" in top["evidence"]
    assert top["gap_closed"]["low"] > 0.5, summary_lines(diagnosis)


def test_a_drafter_trained_on_noisy_features_is_found_to_hardly_read_them(context_lab, tmp_path):
    candidate = build_faulty_drafter(context_lab, "feature-noise")
    reference = context_lab.checkpoints[DRAFTER_STEP]
    diagnosis = diagnose_lab(context_lab, tmp_path, candidate, reference)
    first, top = diagnosis["findings"][:2]
    assert first["title"].startswith("no setting change closes the gap"), summary_lines(diagnosis)
    assert "hardly reads its target features" in top["title"], summary_lines(diagnosis)
    assert not [f for f in diagnosis["findings"] if f["area"] == "repair" and f.get("setting")]
