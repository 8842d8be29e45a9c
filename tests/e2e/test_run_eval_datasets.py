"""`fab run-eval --dataset …` end to end on a lab: named sets built on the workstation from
local data files (the hub is off: tests reach only lab hosts and loopback), uploaded with
each run of a sweep, evaluated per set with intervals by the real harness over real SSH;
then `fab compare` and `fab report`."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dflash_ops.core.inventory import load
from tests.conftest import run_fab
from tests.e2e.conftest import hidden_steps, one_eval_host

pytestmark = pytest.mark.slow


@pytest.fixture
def models_lab(e2e_lab, tmp_path):
    """The shared lab as a trainer with the steps 2000 and 6000 and one eval host."""
    with hidden_steps(e2e_lab, 4000):
        yield one_eval_host(e2e_lab, tmp_path)


@pytest.fixture
def local_sets(tmp_path, monkeypatch) -> str:
    """`--dataset` for a gsm8k-shaped and an MT-Bench-shaped parquet file (text the lab's
    character-level tokenizer knows)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("DFLASH_DATASETS_CACHE", str(tmp_path / "datasets"))
    gsm8k, mt_bench = tmp_path / "gsm8k.parquet", tmp_path / "mt_bench.parquet"
    questions = ["the quick brown fox?", "def add(a, b):", "x = [i * i for", "2 + 2 = 4, and"]
    pq.write_table(pa.Table.from_pylist([{"question": q, "answer": "4"} for q in questions]), gsm8k)
    conversations = [{"prompt": ["Why is the sky blue?", "print('hello')"], "prompt_id": 81}]
    conversations.append({"prompt": ["SELECT name FROM users", "for (int i = 0;"], "prompt_id": 82})
    pq.write_table(pa.Table.from_pylist(conversations), mt_bench)
    return f"gsm8k={gsm8k},mt-bench={mt_bench}"


def test_a_sweep_on_named_sets_gives_per_set_intervals_compare_and_a_report(models_lab, local_sets):
    inventory = models_lab.inventory_path
    swept = run_fab(
        inventory,
        "run-eval", "--steps", "2000,6000", "--dataset", local_sets, "--num-prompts", "3",
        "--max-new-tokens", "16", "--ddtree", "4", "--thinking", "on",
        timeout=600,
    )  # fmt: skip
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert "gsm8k: 3 of 4 rows" in swept.stdout and "mt-bench: 2 of 2 rows" in swept.stdout
    results_root = load(inventory).local.results
    pulled = {}
    for results_file in results_root.glob("*/results.json"):
        outcome = json.loads(results_file.read_text())
        pulled[outcome["checkpoint"]["step"]] = outcome
    assert sorted(pulled) == [2000, 6000]
    for outcome in pulled.values():
        assert outcome["prompts"]["count"] == 3 + 2 * 2  # MT-Bench: one prompt per turn
        assert outcome["prompts"]["thinking"] == "on"
        sets = outcome["prompts"]["datasets"]
        assert sets["gsm8k"]["source"]["files"] == "gsm8k.parquet"
        assert sets["gsm8k"]["source"]["sampled"] is True
        groups = outcome["by_dataset"]["datasets"]
        assert (groups["gsm8k"]["prompts"], groups["mt-bench"]["units"]) == (3, 2)
        overall = outcome["by_dataset"]["overall"]["tau_macro"]
        assert overall["value"] == pytest.approx(outcome["metrics"]["tau_macro"])
        assert overall["low"] <= overall["value"] <= overall["high"]
    assert len(list((results_root / "prompt-sets").glob("prompts-*.jsonl"))) == 1

    compared = run_fab(inventory, "compare", "--report")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "per prompt set (95 % bootstrap intervals over prompts)" in compared.stdout
    assert re.search(r"step 2000 → 6000, gsm8k: τ macro .*: intervals", compared.stdout)
    report_file = results_root / "report.html"
    assert f"report: {report_file}" in compared.stdout.replace("\n", "")
    assert 'id="per-dataset"' in report_file.read_text()

    out = results_root.parent / "elsewhere" / "r.html"
    out.parent.mkdir()  # --out names a file in an existing directory (it makes none)
    reported = run_fab(inventory, "report", "--steps", "6000", "--out", str(out))
    assert reported.returncode == 0, reported.stdout + reported.stderr
    text = out.read_text()
    assert "steps 6000;" in text and "gsm8k.parquet" in text
