"""Served τ beside CPU τ: a pulled served record set beside the CPU run of the same step and
settings, in SGLang's count; a disagreement beyond the served interval is flagged in the
report and is a finding of `fab diagnose`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from dflash_ops.evaluation import results, served_records
from dflash_ops.ui import report
from dflash_ops.ui.compare_view import print_served
from tests.unit.test_report import pull


def served(root: Path, run_id: str, step: int, value: float, **settings) -> None:
    record = {
        "kind": "dflash-served-results",
        "schema_version": 1,
        "step": step,
        "server": {
            "algorithm": "DFLASH",
            "num_draft_tokens": 4,
            "drafter": "/eval/step/drafter",
            "target": "/models/tiny",
            "version": "0.0.0-stand-in",
            "gpus": "0",
        },
        "settings": {
            "max_new_tokens": 24,
            "thinking": False,
            "temperature": 0.0,
            "prompts_sha256": "p" * 64,
            "prompts": 2,
            **settings,
        },
        "served": {
            "tau_macro": {"value": value, "low": value - 0.05, "high": value + 0.05},
            "tau_pooled": {"value": value, "low": value - 0.05, "high": value + 0.05},
            "completion_tokens": 48,
            "verify_steps": 10,
            "convention": "sglang: completion_tokens / spec_verify_ct",
        },
        "per_prompt": [],
        "created_at": "2026-12-01T00:00:00+00:00",
    }
    directory = root / "served" / run_id
    directory.mkdir(parents=True)
    (directory / "served.json").write_text(json.dumps(record))


def test_served_tau_stands_beside_the_cpu_tau_and_a_disagreement_is_a_finding(tmp_path):
    pull(tmp_path, 4000, 2.5)
    [cpu] = results.load_runs(tmp_path)
    counted = served_records.in_sglangs_count(cpu.done)
    rows = cpu.done["per_prompt"]
    expected = sum(r["completion_tokens"] * r["tau"] / (r["completion_tokens"] - 1) for r in rows)
    assert counted["tau_macro"] == pytest.approx(expected / len(rows))
    served(tmp_path, "a-agrees", 4000, counted["tau_macro"] + 0.01)
    served(tmp_path, "b-disagrees", 4000, counted["tau_macro"] + 1.0)
    served(tmp_path, "c-other-budget", 4000, 9.0, max_new_tokens=256)  # not comparable
    side = served_records.side_by_side([cpu], served_records.load_served(tmp_path))
    assert [(row["served_run"], row["agree"]) for row in side] == [
        ("a-agrees", True),
        ("b-disagrees", False),
    ]
    [finding] = served_records.served_findings(tmp_path, 4000, [{"rank": 1}])
    assert finding["rank"] == 2
    assert finding["title"] == "served and CPU τ disagree: features or numerics differ"
    assert "b-disagrees" in finding["evidence"]
    assert served_records.served_findings(tmp_path, 2000, []) == []
    terminal = Console(record=True, width=200)
    print_served(side, "table", terminal)
    shown = terminal.export_text()
    assert "SGLang's count" in shown and "≠ no" in shown and "a-agrees" in shown
    html = report.render(results.compare([cpu], None, None, None), served=side)
    assert "Served τ beside CPU τ" in html and "zlab-07ebd93" in html


def test_a_disagreement_is_written_into_the_pulled_diagnosis(tmp_path):
    from dflash_ops.evaluation.diagnose import read_diagnosis, with_served_findings

    pull(tmp_path, 4000, 2.5)
    [cpu] = results.load_runs(tmp_path)
    served(
        tmp_path, "b-disagrees", 4000, served_records.in_sglangs_count(cpu.done)["tau_macro"] + 1
    )
    pulled = tmp_path / "diagnose" / "run-1" / "diagnose.json"
    pulled.parent.mkdir(parents=True)
    own = {"rank": 1, "area": "config", "title": "block_size differs"}
    pulled.write_text(json.dumps({"findings": [own], "candidate": {"tau_macro": 2.5}}))
    shown = with_served_findings(pulled, read_diagnosis(pulled), tmp_path, 4000)
    kept = read_diagnosis(pulled)
    assert kept == shown and kept["candidate"] == {"tau_macro": 2.5}
    assert [f["title"] for f in kept["findings"]] == [
        "block_size differs",
        "served and CPU τ disagree: features or numerics differ",
    ]
    assert kept["findings"][1]["rank"] == 2 and "b-disagrees" in kept["findings"][1]["evidence"]
    before = pulled.read_bytes()
    assert with_served_findings(pulled, read_diagnosis(pulled), tmp_path, 2000) == kept
    assert pulled.read_bytes() == before  # no served record of that step: nothing written
