"""`diagnose` of a drafter that accepts nothing (τ at its floor, 1.0): every probe's τ
difference is about 0, so the diagnosis says so plainly and judges the probes on the loss of
the target's tokens, which still moves."""

from __future__ import annotations

import copy

import pytest
from dflash_eval.diagnose_findings import TAU_FLOOR, rank
from dflash_eval.diagnose_summary import report_section, summary_lines

from tests.unit.harness.helpers import (
    diagnose_lab,
    random_drafter,
    save_training_checkpoint,
    small_config,
)

pytestmark = pytest.mark.long(200)  # seconds with 4 workers, diagnose measuring repairs


@pytest.fixture(scope="module")
def floored(lab, tmp_path_factory):
    """A diagnosis of an untrained drafter (it accepts ~nothing) against the lab's own."""
    root = tmp_path_factory.mktemp("floor")
    config = small_config(block_size=8, num_target_layers=6)
    candidate = save_training_checkpoint(root / "c" / "checkpoint.pt", random_drafter(config))
    # A short run, vanilla only: a drafter at its floor drafts one round per token.
    return diagnose_lab(
        lab, root, candidate, lab.checkpoints[6000], probe_prompts=4, max_new_tokens=32, ddtree=[]
    )


def test_a_drafter_at_the_tau_floor_is_told_so_and_its_probes_show_the_loss(floored):
    settings = floored["probes"]["settings"]
    assert all(p["tau_base"] < TAU_FLOOR for p in settings), summary_lines(floored)
    floor = [f for f in floored["findings"] if "τ is at its floor" in f["title"]]
    assert len(floor) == 1, summary_lines(floored)
    assert "compared on the loss of the target's tokens" in floor[0]["evidence"]
    rows = report_section(floored)["probes"]
    # τ cannot separate the probes; the loss can: it differs from probe to probe.
    assert len({round(row["loss"], 6) for row in rows}) > 1
    assert all(row["loss_base"] > 0 and row["loss_half_width"] >= 0 for row in rows)


def test_at_the_floor_a_probe_that_lowers_the_loss_beyond_its_interval_is_a_finding(floored):
    diagnosis = copy.deepcopy(floored)
    settings = diagnosis["probes"]["settings"]
    for probe in settings:  # no probe lowers the loss measurably ...
        probe["loss_difference"] = {"mean": 0.01, "half_width": 0.05, "prompts": 4}
    chosen = settings[0]  # ... but this one, clearly
    chosen["loss_difference"] = {"mean": 0.8, "half_width": 0.1, "prompts": 4}
    found = [f for f in rank(diagnosis) if f["area"] == "probe"]
    assert len(found) == 2, found
    assert found[0]["title"].startswith("the target's tokens get likelier with " + chosen["label"])
    assert "τ is at its floor" in found[0]["evidence"]
    assert found[1]["title"].startswith("τ is at its floor")
    assert chosen["label"] in found[1]["evidence"]
    # A drafter off its floor is judged on τ alone: the same loss fall is no finding.
    for probe in settings:
        probe["tau_base"] = 2.0
    assert all("likelier" not in f["title"] for f in rank(diagnosis))
