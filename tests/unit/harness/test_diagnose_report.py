"""A real diagnosis (the harness's `diagnose` on the lab's step-2000 drafter against its
step-6000 one), pulled beside a run of the same step, appears as the report's diagnosis
section with every finding, a row per slot and a row per repair tried."""

from __future__ import annotations

import html
import json

from dflash_eval.contract.progress import Progress
from dflash_eval.diagnose.diagnosis import DiagnoseOptions, run_diagnose
from dflash_eval.run.options import EvalOptions

from dflash_ops.evaluation import results
from dflash_ops.ui import report, report_diagnosis
from tests.unit.test_report import pull


def test_a_real_diagnosis_is_a_section_of_the_report(lab, tmp_path):
    root = tmp_path / "results"
    pull(root, 2000, 1.5)
    pulled = root / report_diagnosis.DIAGNOSE_DIR / "20261201-120000-step2000-eval-ab12"
    pulled.mkdir(parents=True)
    options = EvalOptions(
        checkpoint=lab.checkpoints[2000],
        target=lab.target_dir,
        out=pulled / "diagnose.json",
        threads=1,
        prompts=lab.prompts,
        num_prompts=3,
        max_new_tokens=32,
        cache_dir=tmp_path / "cache",
        reference_drafter=lab.checkpoints[6000],
    )
    diagnosis = run_diagnose(DiagnoseOptions(options, "step 6000"), Progress(quiet=True))
    assert diagnosis["candidate"]["step"] == 2000 and diagnosis["findings"]
    assert json.loads((pulled / "diagnose.json").read_text())["findings"]
    comparison = results.compare(results.load_runs(root))
    text = report.render(comparison, diagnoses=report_diagnosis.pulled(root))
    section = text[text.index('<section id="diagnosis">') :]
    section = section[: section.index("</section>")]
    assert pulled.name in section
    for finding in diagnosis["findings"]:
        assert html.escape(finding["title"]) in section
    tables = section.split("<table")[1:]
    slots, repairs = (table.count("<tr") - 1 for table in tables)
    assert slots == len(diagnosis["candidate"]["metrics"]["per_position"])
    assert repairs == len(diagnosis["repairs"]["tried"]) > 0
