"""The report as a first-time reader meets it: the key numbers and contents at the top, the
acceptance-length histogram, intervals on the per-position and DDTree figures, provenance
reduced to what differs (the rest folded), readable times, samples with the accepted prefix
and the first rejected token marked, and a pulled `fab diagnose` as a section. The slow test
renders it in headless Chromium at desktop and phone widths and keeps the screenshots
(REPORT_SCREENSHOTS=DIR) for a person to look at."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from dflash_ops.evaluation import compare_rows, figures, results
from dflash_ops.ui import report, report_diagnosis
from dflash_ops.ui.report_facts import duration, readable, utc
from tests.unit.test_report import headless_chromium, needs_chromium, pull, shoot


@pytest.fixture
def three_steps(tmp_path) -> Path:
    root = tmp_path / "results"
    for step, level in ((2000, 2.0), (4000, 3.0), (6000, 3.05)):
        pull(root, step, level)
    return root


def _comparison(root: Path) -> results.Comparison:
    return results.compare(results.load_runs(root))


def _section(text: str, anchor: str) -> str:
    found = re.search(rf'<section id="{anchor}">.*?</section>', text, re.S)
    assert found, anchor
    return found.group(0)


def test_the_report_opens_with_the_latest_runs_key_numbers_and_contents(three_steps):
    text = report.render(_comparison(three_steps))
    cards = re.search(r'<div class="cards" id="key-numbers">(.*?)</div>\n', text, re.S)
    assert cards is not None
    labels = re.findall(r'<div class="label">(.*?)</div>', cards.group(1))
    assert labels[:3] == ["τ macro, step 6000", "change from step 4000", "best DDTree τ"]
    latest = results.load_runs(three_steps)[-1].metrics["tau_macro"]
    values = re.findall(r'<div class="value">(.*?)</div>', cards.group(1))
    assert values[0] == f"{latest:.3f}"
    assert "intervals overlap" in cards.group(1)  # 4000 → 6000 is within the noise
    best = compare_rows.run_records(_comparison(three_steps))[-1].flat()
    assert values[2] == f"{best['best_tree']:.3f}"
    assert f"tree budget b = {best['best_tree_budget']}" in cards.group(1)
    contents = re.search(r'<nav class="toc">.*?</nav>', text, re.S).group(0)
    anchors = re.findall(r'href="#([^"]+)"', contents)
    assert anchors == re.findall(r'<section id="([^"]+)">', text)  # every section, in order
    assert "diagnosis" not in anchors  # none pulled


def test_the_histogram_is_each_steps_share_of_rounds_by_length(three_steps):
    rows = _comparison(three_steps).rows
    figure = figures.build(_comparison(three_steps))["acceptance_lengths"]
    axes = figure.axes[0]
    bars = axes.patches
    histogram = rows[-1].metrics["histogram"]
    assert len(bars) == len(rows) * len(histogram)  # a bar per step and length
    last = bars[-len(histogram) :]  # the latest step's bars, lengths 1..B
    total = sum(histogram.values())
    assert [round(b.get_height(), 6) for b in last] == [
        round(histogram[length] / total, 6) for length in sorted(histogram, key=int)
    ]
    assert abs(sum(b.get_height() for b in last) - 1) < 1e-9


def test_per_position_and_ddtree_figures_carry_the_intervals(three_steps):
    comparison = _comparison(three_steps)
    built = figures.build(comparison)
    overall = comparison.rows[-1].done["by_dataset"]["overall"]
    for name, expected in (
        ("acceptance_per_position", [p["conditional"] for p in overall["per_position"]]),
        ("ddtree_budgets", [overall["ddtree"][b]["tau_macro"] for b in ("4", "8")]),
    ):
        axes = built[name].axes[0]
        bars = [c for c in axes.containers if c.has_yerr]
        assert len(bars) == 3, name  # one set of error bars per step
        segments = bars[-1].lines[2][0].get_segments()  # the latest step's vertical bars
        spans = [(round(s[0][1], 6), round(s[1][1], 6)) for s in segments]
        assert spans == [(round(i["low"], 6), round(i["high"], 6)) for i in expected], name


def test_provenance_shows_what_differs_and_folds_the_rest(three_steps):
    text = report.render(_comparison(three_steps))
    provenance = _section(text, "provenance")
    differing, folded = provenance.split("<details>", 1)
    keys = re.findall(r"<tr><th>([^<]+)</th>", differing)
    assert "checkpoint.step" in keys and "run.run_id" in keys  # differ between the runs
    assert "target.fingerprint" not in keys and "host.hostname" not in keys  # shared…
    assert "<th>target.fingerprint</th>" in folded and "<th>host.hostname</th>" in folded
    assert "The same in every run (" in folded  # …and folded
    assert len(keys) < 20 < folded.count("<tr>")
    assert "1970-01-01 00:33:20 UTC" in differing  # run.started 2000 s, as a date


def test_times_read_as_dates_and_durations():
    assert duration(0.4213) == "0.42 s" and duration(12.34) == "12.3 s"
    assert duration(185) == "3 min 05 s" and duration(7440) == "2 h 04 min"
    assert utc(1764590400) == "2025-12-01 12:00:00 UTC"
    assert readable("run.started", 1764590400) == "2025-12-01 12:00:00 UTC"
    assert readable("timings_s.total", 185.2) == "3 min 05 s"
    assert readable("checkpoint.step", 4000) == 4000 and readable("run.started", "x") == "x"
    assert readable("run.finished", 1e300) == "1e+300"  # not a date: the number as recorded


def test_samples_mark_the_accepted_prefix_and_the_first_rejected_token(three_steps):
    text = _section(report.render(_comparison(three_steps)), "decoded-samples")
    assert '<h3>gsm8k-3 <span class="set">(gsm8k)</span></h3>' in text
    assert "1 of 3 accepted" in text
    draft = re.search(r'<span class="who">draft</span>(.*?)</div>', text).group(1)
    assert re.findall(r'<span class="tok (\w+)">([^<]*)</span>', draft) == [
        ("ok", " sells"), ("miss", " a"), ("rest", " egg"),
    ]  # fmt: skip
    target = re.search(r'<span class="who">target</span>(.*?)</div>', text).group(1)
    assert re.findall(r'<span class="tok (\w+)">', target) == ["ok", "want", "rest"]


def test_samples_written_before_tokens_show_their_text(tmp_path):
    root = tmp_path / "results"
    pull(root, 6000, 3.0)
    path = root / "run-6000" / "results.json"
    document = json.loads(path.read_text())
    for key in ("target_tokens", "draft_tokens"):
        del document["samples"][0]["rounds"][0][key]
    document["samples"][0]["rounds"][0]["newer_field"] = "<kept>"  # from a newer harness
    path.write_text(json.dumps(document))
    text = _section(report.render(_comparison(root)), "decoded-samples")
    assert '<span class="tok ">&#39; sells a egg&#39;</span>' not in text
    assert '<span class="tok "> sells a egg</span>' in text and "1 accepted" in text
    assert "newer_field <code>&lt;kept&gt;</code>" in text


def _diagnosis(root: Path, step: int, run_id: str) -> Path:
    directory = root / report_diagnosis.DIAGNOSE_DIR / run_id
    directory.mkdir(parents=True)
    finding = {
        "rank": 1,
        "area": "repair",
        "title": "block size 16 <raises> τ",
        "evidence": "τ 2.1 → 3.4",
        "check_next": "the config's block_size",
    }
    side = {
        "checkpoint": f"/eval/step_{step}/checkpoint.pt",
        "step": step,
        "training_run": None,
        "metrics": {"tau_macro": 2.1, "per_position": [{"position": 1, "conditional": 0.5}]},
        "calibration": [{"slot": 1, "confidence": 0.3, "accuracy": 0.5, "entropy": 2.0}],
    }
    other = {
        **side,
        "metrics": {"tau_macro": 3.4, "per_position": [{"position": 1, "conditional": 0.8}]},
    }
    repair = {
        "label": "block size 16",
        "tau": 3.4,
        "delta_tau": {"value": 1.3, "low": 1.1, "high": 1.5},
        "gap_closed": {"value": 1.0, "low": 0.85, "high": 1.15},
        "verdict": "finding",
    }
    diagnosis = {
        "against": "reference",
        "candidate": side,
        "other": other,
        "gap": {"mean": -1.3, "half_width": 0.2, "prompts": 8},
        "findings": [finding],
        "repairs": {
            "prompts": 8,
            "tau_candidate": 2.1,
            "tau_other": 3.4,
            "alpha": 0.05,
            "min_delta_tau": 0.05,
            "min_gap_share": 0.1,
            "tried": [repair],
        },
    }
    (directory / "diagnose.json").write_text(json.dumps(diagnosis))
    return directory


def test_a_pulled_diagnosis_of_a_shown_step_is_a_section(three_steps):
    _diagnosis(three_steps, 4000, "diag-4000")
    _diagnosis(three_steps, 9000, "diag-9000")  # a step the report does not show
    broken = three_steps / report_diagnosis.DIAGNOSE_DIR / "diag-broken"
    broken.mkdir()
    (broken / "diagnose.json").write_text("{not json")
    text = report.render(_comparison(three_steps), diagnoses=report_diagnosis.pulled(three_steps))
    section = _section(text, "diagnosis")
    assert "diag-4000" in section and "diag-9000" not in section
    assert "[repair] block size 16 &lt;raises&gt; τ" in section  # ranked finding, escaped
    assert "τ 2.10 vs reference 3.40 (gap -1.30 ± 0.20, 95%, 8 prompts)" in section
    assert "<th>candidate acc.</th><th>reference acc.</th>" in section  # the slot table
    assert "<td>0.500</td><td>0.800</td><td>0.300</td>" in section
    assert '<td class="text">block size 16</td><td>3.400</td><td>1.300</td>' in section
    assert "<td>1.000</td><td>0.850</td><td>1.150</td>" in section  # the share closed
    assert "diag-broken" in section and "cannot read the diagnosis" in section
    assert 'href="#diagnosis"' in text


def test_compare_puts_a_pulled_diagnosis_in_the_report(three_steps, tmp_path):
    from dflash_ops.ui.compare_commands import show_comparison

    _diagnosis(three_steps, 6000, "diag-6000")
    show_comparison(three_steps, plots=tmp_path / "plots", with_report=True)
    assert '<section id="diagnosis">' in (three_steps / report.REPORT_NAME).read_text()


@pytest.mark.slow
@needs_chromium
@pytest.mark.parametrize(("width", "name"), [(1280, "desktop"), (390, "phone")])
def test_chromium_renders_the_report_at_desktop_and_phone_widths(
    three_steps, tmp_path, width, name
):
    from PIL import Image

    _diagnosis(three_steps, 6000, "diag-6000")
    comparison = _comparison(three_steps)
    path = report.write(
        comparison,
        three_steps / report.REPORT_NAME,
        diagnoses=report_diagnosis.pulled(three_steps),
    )
    keep = Path(os.environ.get("REPORT_SCREENSHOTS", tmp_path))
    keep.mkdir(parents=True, exist_ok=True)
    browser = [*headless_chromium(tmp_path / "profile"), f"--window-size={width},3000"]
    image = Image.open(shoot(browser, path, keep / f"report-{name}.png")).convert("L")
    assert image.size[0] == width
    histogram = image.histogram()  # pixels per grey level: text and figures, not blank
    assert sum(c for level, c in enumerate(histogram) if level < 200) / sum(histogram) > 0.02
    dom = subprocess.run(
        [*browser, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=180
    ).stdout
    assert 'id="key-numbers"' in dom and '<nav class="toc">' in dom
    assert dom.count("<svg") == 5 and '<section id="diagnosis">' in dom


def test_a_warning_every_run_gave_is_shown_once(three_steps):
    provenance = _section(report.render(_comparison(three_steps)), "provenance")
    warning = results.load_runs(three_steps)[0].done["warnings"][0]
    assert provenance.count(warning) == 1 and "(every run)" in provenance
