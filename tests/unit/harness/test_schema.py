"""The shared results schema: importable without torch, checked on reading (a file written
earlier under the same schema version still reads), and the one human summary."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dflash_eval.contract import schema_check, schema_doc
from dflash_eval.contract.reading import comparability_id
from dflash_eval.contract.summary import headline, summary_lines

from tests.schema_samples import LATER_KEYS, SCHEMA_3_KEYS, results_dict, sampled_results_dict

REMOTE = Path(__file__).resolve().parents[3] / "remote"


def test_importing_the_contract_loads_no_torch():
    # A fresh interpreter that sees only remote/: every module of what the workstation imports.
    probe = (
        "import importlib, json, pkgutil, sys; sys.path.insert(0, sys.argv[1]); "
        "from dflash_eval import contract; from dflash_eval.contract import schema; "
        "[importlib.import_module(m.name) for m in "
        "pkgutil.iter_modules(contract.__path__, 'dflash_eval.contract.')]; "
        "print(json.dumps([schema.__file__, sorted(sys.modules)]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(REMOTE)], capture_output=True, text=True, check=True
    )
    path, modules = json.loads(result.stdout)
    assert Path(path) == REMOTE / "dflash_eval" / "contract" / "schema.py"
    assert "dflash_eval.contract.summary" in modules and "dflash_eval.contract.parser" in modules
    assert not [name for name in modules if name.split(".")[0] in ("torch", "transformers")]


def test_summary_leads_with_step_and_tau_then_says_what_was_evaluated():
    lines = summary_lines(results_dict(reference=True))
    assert lines[0] == (
        "step 2000  τ macro 1.500  τ pooled 1.250  (8 rounds, 10 tokens, block size 4)"
    )
    assert lines[1].endswith(
        "z-lab's 07ebd93 loop (last block shortened, capped at the completion end): "
        "macro 1.500, pooled 1.250"
    )
    assert lines[2] == "DDTree τ: b=4: 1.750, b=8: 1.750"
    assert lines[3] == "acceptance by position (conditional): 1:0.50, 2:0.25, 3:n/a"
    assert lines[4] == "reference drafter τ macro 3.000 (this run: 0.50× of it)"
    assert lines[5].startswith("Checkpoint /eval/step_2000/checkpoint.pt (1234 bytes, sha256 abab")
    assert lines[6] == "Target tiny (qwen3), 2 prompts"
    key = comparability_id(results_dict(reference=True))
    assert lines[7] == f"Comparability key {key}: compared only with runs of this key"
    assert lines[8] == "Drafter: 8 blocks in 0.5 s (16.0 blocks/s, 1 threads); total 3.2 s"
    assert lines[9] == "WARNING: block size 4 differs from the trained 8"


def test_a_sampled_run_summary_says_so_with_its_monte_carlo_interval():
    lines = summary_lines(schema_check.parse_results(sampled_results_dict()))
    assert lines[0] == (
        "step 2000  τ macro 1.500  τ pooled 1.250  (7.5 rounds, 10.2 tokens, block size 4)"
    )
    assert lines[1] == (
        "  sampled at T 0.7 (top-p 0.95, top-k 0, seed 0): expectations given the sampled "
        "paths; Monte Carlo τ macro 1.370 [1.350, 1.390] (200 walks per prompt)"
    )


def test_summary_leaves_out_what_the_run_did_not_measure():
    lines = summary_lines(results_dict(budgets=()))
    assert not [line for line in lines if line.startswith(("DDTree", "reference"))]


def test_headline_carries_the_key_numbers():
    assert headline(results_dict(reference=True)) == {
        "step": 2000,
        "tau_macro": 1.5,
        "tau_pooled": 1.25,
        "rounds": 8,
        "ddtree": {"4": 1.75, "8": 1.75},
        "reference_tau_macro": 3.0,
        "seconds": 3.25,
    }


def test_a_results_file_written_before_the_later_keys_still_reads():
    results = results_dict(reference=True)
    for block, keys in LATER_KEYS.items():
        record = results if block == "results" else results[block]
        for key in keys:
            record.pop(key, None)
    assert schema_check.parse_results(results) is results
    assert summary_lines(results)[0].startswith("step 2000  τ macro 1.500")


def test_a_schema_2_file_still_reads_and_schema_1_is_named():
    results = results_dict(reference=True)
    results["schema_version"] = 2
    for block, keys in SCHEMA_3_KEYS.items():
        for key in keys:
            results[block].pop(key)
    results["metrics"]["capped"].pop("tau_convention")
    assert schema_check.parse_results(results) is results
    assert summary_lines(results)[1].endswith(
        "; capped at the completion end: macro 1.500, pooled 1.250"
    )
    results["schema_version"] = 1
    with pytest.raises(
        schema_check.SchemaError, match="schema_version 1, this dflash-ops reads 2, 3"
    ):
        schema_check.parse_results(results)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda r: r["metrics"].pop("tau_macro"), "results.metrics: no tau_macro"),
        (
            lambda r: r["metrics"]["ddtree"]["4"].update(rounds="8"),
            "results.metrics.ddtree.4.rounds: expected a finite number, found str '8'",
        ),
        (
            lambda r: r["checkpoint"].update(step=True),
            "results.checkpoint.step: expected int, found bool True",
        ),
        (
            lambda r: r["completions"].update(source="magic"),
            "results.completions.source: expected 'local-greedy' | 'sglang' | 'local-sampled', "
            "found str 'magic'",
        ),
        (
            lambda r: r["reference"]["metrics"]["per_position"].append(None),
            "results.reference.metrics.per_position[3]: expected an object (PositionRate)",
        ),
        (lambda r: r.update(warnings="none"), "results.warnings: expected a list, found str"),
        (lambda r: r.update(schema_version=1), "schema_version 1, this dflash-ops reads 2"),
        (lambda r: r.update(kind="other"), "not a dflash-eval results file"),
    ],
)
def test_a_damaged_file_is_refused_naming_the_field(damage, message):
    results = results_dict(reference=True)
    damage(results)
    with pytest.raises(schema_check.SchemaError) as refused:
        schema_check.parse_results(results)
    assert str(refused.value).startswith(message)


def test_keys_the_types_do_not_name_pass_a_newer_harness_may_add_them():
    results = results_dict()
    results["metrics"]["something_new"] = {"any": ["shape"]}
    assert schema_check.parse_results(results) is results


def test_the_schema_page_is_written_from_the_types_and_shows_every_one():
    page = (REMOTE.parent / "docs" / "results-schema.md").read_text(encoding="utf-8")
    assert schema_doc.render(page) == page, (
        "docs/results-schema.md differs from the types: run "
        "`cd remote && python -m dflash_eval.contract.schema_doc ../docs/results-schema.md`"
    )
    assert schema_doc.reachable() <= schema_doc.documented(page)


def test_the_schema_page_lists_every_progress_event_the_harness_sends():
    page = (REMOTE.parent / "docs" / "results-schema.md").read_text(encoding="utf-8")
    table = page.split("## Progress events")[1].split("\n## ")[0]
    listed = set(re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE))
    sources = (REMOTE / "dflash_eval").rglob("*.py")
    sent = {e for path in sources for e in re.findall(r'event\(\s*"(\w+)"', path.read_text())}
    assert "done" in sent and listed == sent
