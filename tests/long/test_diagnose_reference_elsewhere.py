"""`diagnose` on the issue's own case: the lab's step 4000, only less trained, against the
published-format reference kept outside the run's directory (as an eval host keeps it), at
`fab diagnose`'s default length. A larger block raises τ, but the reference's more: the
control names it as not a repair, and no setting is claimed."""

from __future__ import annotations

import shutil

import pytest
from dflash_eval.contract.diagnose_summary import summary_lines

from dflash_lab.content import reference_drafter
from tests.unit.harness.helpers import diagnose_lab

pytestmark = pytest.mark.long(65)  # seconds in a cold `make test` (5 workers)


def test_a_less_trained_step_against_a_reference_elsewhere_gets_no_setting_claim(lab, tmp_path):
    reference = tmp_path / "models" / "reference-drafter"
    shutil.copytree(reference_drafter(lab.checkpoints[6000]), reference)
    # at fab diagnose's default length: at 96 tokens the larger block is no finding at all
    diagnosis = diagnose_lab(
        lab, tmp_path, lab.checkpoints[4000], reference, max_new_tokens=256, against="reference"
    )
    claims = [f for f in diagnosis["findings"] if f["area"] in ("repair", "configuration")]
    assert [f for f in claims if f.get("setting")] == [], summary_lines(diagnosis)
    [wider] = [f for f in diagnosis["findings"] if f["area"] == "setting"]
    assert wider["title"].startswith("block size 16 (config 8) raises reference's τ more than")
    assert wider["title"].endswith(": not a repair")
    tried = diagnosis["repairs"]["tried"]
    control = next(r for r in tried if r["label"].startswith("block size 16"))["control"]
    assert control["widens_gap"] and control["beyond_other"]["high"] < 0
    titles = [f["title"] for f in diagnosis["findings"]]
    assert titles.index(wider["title"]) > titles.index(
        next(t for t in titles if t.startswith("no setting change closes the gap"))
    )
