"""Served τ beside CPU τ: a pulled served record set beside the CPU run of the same step and
settings, in SGLang's count; a disagreement beyond the served interval is flagged in the
report and is a finding of `fab diagnose`."""

from __future__ import annotations

import json
import re
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from rich.console import Console

from dflash_ops.evaluation import results, served_agreement, served_records
from dflash_ops.ui import report
from dflash_ops.ui.compare_view import print_served
from tests.unit.test_report import pull


def served(
    root: Path,
    run_id: str,
    step: int,
    value: float,
    *,
    rows: list[dict] | None = None,
    macro: dict | None = None,
    target: str = "/models/tiny",
    **settings,
) -> None:
    """A pulled served record: τ `value` ± 0.05 (or the `macro` interval), `rows` per prompt."""
    record = {
        "kind": "dflash-served-results",
        "schema_version": 1,
        "step": step,
        "server": {
            "algorithm": "DFLASH",
            "num_draft_tokens": 4,
            "drafter": "/eval/step/drafter",
            "target": target,
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
            "tau_macro": macro or {"value": value, "low": value - 0.05, "high": value + 0.05},
            "tau_pooled": {"value": value, "low": value - 0.05, "high": value + 0.05},
            "completion_tokens": 48,
            "verify_steps": 10,
            "convention": "sglang: completion_tokens / spec_verify_ct",
        },
        "per_prompt": rows or [],
        "created_at": "2026-12-01T00:00:00+00:00",
    }
    directory = root / "served" / run_id
    directory.mkdir(parents=True)
    (directory / "served.json").write_text(json.dumps(record))


def test_served_tau_stands_beside_the_cpu_tau_and_a_disagreement_is_a_finding(tmp_path):
    pull(tmp_path, 4000, 2.5)
    [cpu] = results.load_runs(tmp_path)
    counted = served_agreement.in_sglangs_count(cpu.done)
    rows = cpu.done["per_prompt"]
    expected = sum(r["completion_tokens"] * r["tau"] / (r["completion_tokens"] - 1) for r in rows)
    assert counted["tau_macro"]["value"] == pytest.approx(expected / len(rows))
    served(tmp_path, "a-agrees", 4000, counted["tau_macro"]["value"] + 0.01)
    served(tmp_path, "b-disagrees", 4000, counted["tau_macro"]["high"] + 1.0)
    served(tmp_path, "c-other-budget", 4000, 9.0, max_new_tokens=256)  # not comparable
    served(tmp_path, "d-other-model", 4000, 9.0, target="/gpu/models/other")  # not comparable
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
    from dflash_ops.evaluation.diagnose import finish_pulled, read_diagnosis

    pull(tmp_path, 4000, 2.5)
    [cpu] = results.load_runs(tmp_path)
    served(
        tmp_path,
        "b-disagrees",
        4000,
        served_agreement.in_sglangs_count(cpu.done)["tau_macro"]["high"] + 1,
    )
    pulled = tmp_path / "diagnose" / "run-1" / "diagnose.json"
    pulled.parent.mkdir(parents=True)
    own = {"rank": 1, "area": "config", "title": "block_size differs"}
    pulled.write_text(json.dumps({"findings": [own], "candidate": {"tau_macro": 2.5}}))
    shown = finish_pulled(pulled, tmp_path, None, 4000)
    kept = read_diagnosis(pulled)
    assert kept == shown and kept["candidate"] == {"tau_macro": 2.5}
    assert [f["title"] for f in kept["findings"]] == [
        "block_size differs",
        "served and CPU τ disagree: features or numerics differ",
    ]
    assert kept["findings"][1]["rank"] == 2 and "b-disagrees" in kept["findings"][1]["evidence"]
    pulled.write_text(json.dumps({"findings": [own], "candidate": {"tau_macro": 2.5}}))
    titles = [f["title"] for f in finish_pulled(pulled, tmp_path, None, 2000)["findings"]]
    assert titles == ["block_size differs"]  # no served record of that step: no finding


def cpu_results(*rows: tuple[str, int, float]) -> dict:
    """Per-prompt rows (conversation, completion tokens, τ capped) as a CPU run holds them."""
    return {
        "per_prompt": [
            {"id": f"p{i}", "conversation": talk, "completion_tokens": tokens, "tau_capped": tau}
            for i, (talk, tokens, tau) in enumerate(rows)
        ]
    }


def test_the_cpu_figure_in_sglangs_count_carries_the_served_kind_of_interval():
    # 11 tokens at τ capped 2.5: 4 rounds, 2.75 in SGLang's count; 9 at 4.0: 2 rounds, 4.5.
    counted = served_agreement.in_sglangs_count(cpu_results(("a", 11, 2.5), ("b", 9, 4.0)))
    # Two conversations: each resample is one of them twice, or both; the 95 % interval
    # reaches the two ends.
    assert counted["tau_macro"] == {"value": 3.625, "low": 2.75, "high": 4.5}
    assert counted["tau_pooled"] == pytest.approx({"value": 20 / 6, "low": 2.75, "high": 4.5})
    alike = served_agreement.in_sglangs_count(cpu_results(("a", 11, 2.5), ("b", 11, 2.5)))
    assert alike["tau_macro"] == {"value": 2.75, "low": 2.75, "high": 2.75}
    # Two turns of one conversation are one unit, as the served τ counts them: no bounds.
    one = served_agreement.in_sglangs_count(cpu_results(("a", 11, 2.5), ("a", 9, 4.0)))
    assert one["tau_macro"] == {"value": 3.625, "low": None, "high": None}
    assert served_agreement.in_sglangs_count(cpu_results(("a", 1, 1.0))) is None


@pytest.mark.parametrize(
    ("served_interval", "agree"),
    [
        ({"value": 3.1, "low": 3.0, "high": 3.2}, True),  # inside the CPU interval
        ({"value": 4.7, "low": 4.4, "high": 5.0}, True),  # CPU value outside, intervals overlap
        ({"value": 4.7, "low": 4.6, "high": 4.8}, False),  # beyond both intervals
        ({"value": 2.0, "low": 1.5, "high": 2.7}, False),
        ({"value": 4.4, "low": None, "high": None}, True),  # one conversation: its value inside
        ({"value": 4.6, "low": None, "high": None}, False),
    ],
)
def test_served_and_cpu_agree_when_their_intervals_overlap(served_interval, agree):
    cpu = {"value": 3.625, "low": 2.75, "high": 4.5}
    assert served_agreement.overlap(cpu, served_interval) is agree
    assert served_agreement.overlap(served_interval, cpu) is agree
    unbounded = {"value": 3.625, "low": None, "high": None}
    assert served_agreement.overlap(unbounded, {**served_interval, "low": None, "high": None})


def test_compare_shows_served_runs_among_themselves_by_their_own_key(tmp_path, capsys):
    from dflash_ops.ui.compare_commands import show_comparison

    pull(tmp_path, 4000, 2.5)
    served(tmp_path, "s-6000", 6000, 3.25)
    served(tmp_path, "s-4000", 4000, 2.75)
    served(tmp_path, "s-4000-long", 4000, 9.0, max_new_tokens=256)  # another key
    served(tmp_path, "s-2000-think", 2000, 1.5, thinking=True)  # another key
    groups = served_records.served_groups(served_records.load_served(tmp_path))
    assert [item.run_id for item in groups[0].rows] == ["s-4000", "s-6000"]
    assert sorted(len(group.rows) for group in groups) == [1, 1, 2]
    assert len({group.id for group in groups}) == 3
    assert groups[0].key["max_new_tokens"] == 24 and "drafter" not in groups[0].key
    assert served_records.served_run_cells(groups[0]) == [
        ["4000", "2.750 [2.700, 2.800]", "2.750 [2.700, 2.800]", "10", "s-4000"],
        ["6000", "3.250 [3.200, 3.300]", "3.250 [3.200, 3.300]", "10", "s-6000"],
    ]
    show_comparison(tmp_path)
    table = capsys.readouterr().out
    assert f"served runs, key {groups[0].id} (group 1 of 3)" in table
    assert "s-6000" in table and "s-4000-long" in table and "s-2000-think" in table
    show_comparison(tmp_path, fmt="json")
    assert json.loads(capsys.readouterr().out)["runs"]  # stdout: the comparison alone


class _Tables(HTMLParser):
    """The text of every cell of each table with an id, row by row (the header row first)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.rows: list[list[str]] | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and dict(attrs).get("id"):
            self.rows = self.tables.setdefault(dict(attrs)["id"] or "", [])
        elif tag == "tr" and self.rows is not None:
            self.rows.append([])
        elif tag in ("td", "th") and self.rows is not None:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.rows is not None and self.cell is not None:
            self.rows[-1].append("".join(self.cell))
            self.cell = None
        elif tag == "table":
            self.rows = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def test_the_report_shows_served_beside_cpu_and_served_runs_by_their_own_key(tmp_path):
    from dflash_ops.ui.compare_commands import write_report

    pull(tmp_path, 4000, 2.5)
    [cpu] = results.load_runs(tmp_path)
    counted = served_agreement.in_sglangs_count(cpu.done)["tau_macro"]
    served(tmp_path, "s-4000", 4000, counted["value"] + 0.01)
    served(tmp_path, "s-6000", 6000, 3.25)
    hostile = "<script>alert(1)</script>&"
    served(tmp_path, f"s-{hostile.replace('/', '')}", 2000, 2.0, target=hostile)
    served_runs = served_records.load_served(tmp_path)
    side = served_records.side_by_side([cpu], served_runs)
    groups = served_records.served_groups(served_runs)
    html = write_report(tmp_path).read_text()
    parser = _Tables()
    parser.feed(html)
    tables = parser.tables
    header, *rows = tables["served-beside-cpu"]
    assert header == served_records.SERVED_HEADER and rows == served_records.served_cells(side)
    [beside] = rows
    assert beside[0] == "4000" and beside[-3:] == [
        "yes",
        "interval overlap (no per-prompt values)",
        "s-4000",
    ]
    assert beside[3] == f"{counted['value'] + 0.01:.3f} [{counted['value'] - 0.04:.3f}, " + (
        f"{counted['value'] + 0.06:.3f}]"
    )
    assert [row.run_id for row in groups[0].rows] == ["s-4000", "s-6000"]
    for group in groups:
        rows = tables[f"served-group-{group.number}"]
        assert rows == [served_records.SERVED_RUNS_HEADER, *served_records.served_run_cells(group)]
        assert served_records.group_title(group, 2) in unescape(html)
    assert tables["served-group-1"][2] == [
        "6000",
        "3.250 [3.200, 3.300]",
        "3.250 [3.200, 3.300]",
        "10",
        "s-6000",
    ]
    assert tables["served-group-2"][1][-1] == "s-<script>alert(1)<script>&"
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;&amp;" in html
    anchors = re.findall(r' id="(served[^"]*)"', html)  # the section and each table its own
    assert sorted(anchors) == ["served", "served-beside-cpu", "served-group-1", "served-group-2"]
