"""The shared results schema: importable without torch, and the one human summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dflash_eval import schema

from tests.schema_samples import results_dict

REMOTE = Path(__file__).resolve().parents[2] / "remote"


def test_importing_the_schema_loads_no_torch():
    # A fresh interpreter that sees only remote/: what the workstation side imports.
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); from dflash_eval import schema; "
        "import json; print(json.dumps([schema.__file__, sorted(sys.modules)]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(REMOTE)], capture_output=True, text=True, check=True
    )
    path, modules = json.loads(result.stdout)
    assert Path(path) == REMOTE / "dflash_eval" / "schema.py"
    assert not [name for name in modules if name.split(".")[0] in ("torch", "transformers")]


def test_summary_leads_with_step_and_tau_then_says_what_was_evaluated():
    lines = schema.summary_lines(results_dict(reference=True))
    assert lines[0] == (
        "step 2000  τ macro 1.500  τ pooled 1.250  (8 rounds, 10 tokens, block size 4)"
    )
    assert lines[1] == "DDTree τ: b=4: 1.750, b=8: 1.750"
    assert lines[2] == "acceptance by position (conditional): 1:0.50, 2:0.25, 3:n/a"
    assert lines[3] == "reference drafter τ macro 3.000 (this run: 0.50× of it)"
    assert lines[4].startswith("Checkpoint /eval/step_2000/checkpoint.pt (1234 bytes, sha256 abab")
    assert lines[5] == "Target tiny (qwen3), 2 prompts"
    assert lines[6] == "Drafter: 8 blocks in 0.5 s (16.0 blocks/s, 1 threads); total 3.2 s"
    assert lines[7] == "WARNING: block size 4 differs from the trained 8"


def test_summary_leaves_out_what_the_run_did_not_measure():
    lines = schema.summary_lines(results_dict(budgets=()))
    assert not [line for line in lines if line.startswith(("DDTree", "reference"))]


def test_headline_carries_the_key_numbers():
    assert schema.headline(results_dict(reference=True)) == {
        "step": 2000,
        "tau_macro": 1.5,
        "tau_pooled": 1.25,
        "rounds": 8,
        "ddtree": {"4": 1.75, "8": 1.75},
        "reference_tau_macro": 3.0,
        "seconds": 3.25,
    }
