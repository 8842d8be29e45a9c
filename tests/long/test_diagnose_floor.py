"""`diagnose` of a drafter that accepts nothing (τ at its floor, 1.0) against a trained one:
no setting change closes that gap, and the diagnosis says so with the largest repair it
measured, never naming a configuration cause (the case of a merely less-trained drafter)."""

from __future__ import annotations

import pytest
from dflash_eval.contract.diagnose_summary import report_section, summary_lines

from tests.unit.harness.helpers import (
    diagnose_lab,
    random_drafter,
    save_training_checkpoint,
    small_config,
)

pytestmark = pytest.mark.long(15)  # seconds in a cold `make test` (5 workers)


@pytest.fixture(scope="module")
def floored(lab, tmp_path_factory):
    """A diagnosis of an untrained drafter (it accepts ~nothing) against the lab's own."""
    root = tmp_path_factory.mktemp("floor")
    config = small_config(block_size=8, num_target_layers=6)
    candidate = save_training_checkpoint(root / "c" / "checkpoint.pt", random_drafter(config))
    # A short run, vanilla only: a drafter at its floor drafts one round per token.
    return diagnose_lab(lab, root, candidate, lab.checkpoints[6000], max_new_tokens=32, ddtree=[])


def test_an_untrained_drafter_gets_no_configuration_claim(floored):
    repairs = floored["repairs"]
    assert repairs["tau_candidate"] < 1.05 < repairs["tau_other"]
    assert all(r["verdict"] == "no measurable effect" for r in repairs["tried"])
    first = floored["findings"][0]
    assert (
        first["title"]
        == f"no setting change closes the gap ({len(repairs['tried'])} repairs tried)"
    )
    assert "the gap is in the weights" in first["check_next"]
    assert not [f for f in floored["findings"] if f["area"] == "repair"][1:]
    lines = summary_lines(floored)
    assert any(line.endswith(")") and "repairs tried on" in line for line in lines), lines
    rows = report_section(floored)["repairs"]
    assert len(rows) == len(repairs["tried"]) and all(r["delta_tau_low"] is not None for r in rows)
