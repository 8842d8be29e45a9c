"""Intervals in `compare` (per-set table, overlap of consecutive steps) and the HTML report:
self-contained, with every section, and rendered by a real headless Chromium (Debian's
package) into a screenshot that is not blank and a DOM that holds the per-set table."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from dflash_eval.walk.by_dataset import acceptance_counts, intervals

from dflash_ops.evaluation import compare_rows, results
from dflash_ops.ui import report
from tests.schema_samples import results_dict

SETS = ("gsm8k", "humaneval")


def per_prompt(level: float, seed: int) -> list[dict]:
    """Twelve prompts per set whose τ scatter around `level` (humaneval a little higher)."""
    rng = random.Random(seed)
    rows = []
    for name in SETS:
        for n in range(12):
            tau = max(1.0, rng.gauss(level + (0.4 if name == "humaneval" else 0.0), 0.3))
            rounds = rng.randint(10, 30)
            slots = [[rng.random() < 0.6, rng.random() < 0.5] for _ in range(rounds)]
            rows.append(
                {
                    "id": f"{name}-{n}",
                    "dataset": name,
                    "conversation": f"{name}-{n}",
                    "rounds": rounds,
                    "tau": tau,
                    "ddtree_tau": {"4": tau + 0.3, "8": tau + 0.5},
                    "acceptance": acceptance_counts(slots),
                    "prompt_tokens": 20,
                    "completion_tokens": 64,
                    "stopped": False,
                    "reference_tokens": 68,
                    "tau_capped": tau,
                    "cache": {"completion": False, "hidden_states": False},
                }
            )
    return rows


def pull(root: Path, step: int, level: float, **changes) -> None:
    """A pulled run whose results carry per-set intervals (and, at 6000, decoded samples)."""
    outcome = results_dict()
    outcome["checkpoint"]["step"] = step
    rows = per_prompt(level, seed=step)
    outcome["per_prompt"] = rows
    outcome["by_dataset"] = intervals(rows, ["4", "8"], resamples=300)
    overall = outcome["by_dataset"]["overall"]
    for metric in ("tau_macro", "tau_pooled"):  # the run's metrics agree with it
        outcome["metrics"][metric] = overall[metric]["value"]
    outcome["prompts"]["datasets"] = {
        name: {
            "count": 12,
            "sha256": "s" * 64,
            "source": {"repo": f"org/{name}", "revision": "feedc0de" * 5, "seed": 0},
        }
        for name in SETS
    }
    if step == 6000:
        outcome["samples"] = [
            {
                "id": "gsm8k-3",
                "dataset": "gsm8k",
                "completion_start": "Janet sells the <eggs> & keeps",
                "rounds": [
                    {
                        "position": 4,
                        "anchor": "Janet",
                        "target": " sells the eggs",
                        "draft": " sells a egg",
                        "accepted": 1,
                        "target_tokens": [" sells", " the", " eggs"],
                        "draft_tokens": [" sells", " a", " egg"],
                    }
                ],
            }
        ]
    for block, values in changes.items():
        outcome[block].update(values)
    directory = root / f"run-{step}"
    directory.mkdir(parents=True)
    run = {"run_id": directory.name, "host": "eval", "state": "succeeded", "step": step}
    (directory / "run.json").write_text(json.dumps({**run, "started": step}))
    (directory / "results.json").write_text(json.dumps(outcome))


@pytest.fixture
def three_steps(tmp_path) -> Path:
    root = tmp_path / "results"
    pull(root, 2000, 2.0)
    pull(root, 4000, 3.0)
    pull(root, 6000, 3.05)  # within the noise of 4000
    return root


def test_compare_gives_intervals_per_set_and_says_which_steps_overlap(three_steps):
    comparison = results.compare(results.load_runs(three_steps))
    header, cells = compare_rows.table_rows(comparison)
    assert header[5] == "τ macro 95% CI" and re.fullmatch(r"\[\d\.\d{3}, \d\.\d{3}\]", cells[0][5])
    header, cells = compare_rows.dataset_rows(comparison)
    assert header[:6] == [
        "run", "step", "prompt set", "prompts", "τ macro [95% CI]", "τ pooled [95% CI]",
    ]  # fmt: skip
    assert [row[2] for row in cells[:3]] == ["all prompts", "gsm8k", "humaneval"]
    assert re.fullmatch(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]", cells[1][4])
    notes = compare_rows.overlap_notes(comparison)
    assert len(notes) == 6  # two pairs of steps × (all prompts, gsm8k, humaneval)
    assert all("do not overlap" in note for note in notes if note.startswith("step 2000 → 4000"))
    assert all("intervals overlap" in note for note in notes if note.startswith("step 4000"))


def test_results_without_intervals_show_none(tmp_path):
    root = tmp_path / "results"
    for step in (2000, 4000):
        directory = root / f"old-{step}"
        directory.mkdir(parents=True)
        outcome = results_dict()
        outcome["checkpoint"]["step"] = step
        (directory / "run.json").write_text(json.dumps({"run_id": directory.name, "step": step}))
        (directory / "results.json").write_text(json.dumps(outcome))
    comparison = results.compare(results.load_runs(root))
    assert compare_rows.dataset_rows(comparison)[1] == []
    assert compare_rows.overlap_notes(comparison) == []
    assert "No run carries confidence intervals" in report.render(comparison)


def test_the_report_is_one_self_contained_file_with_every_section(three_steps):
    pull(three_steps, 8000, 3.5, prompts={"max_new_tokens": 48})  # not comparable
    comparison = results.compare(results.load_runs(three_steps))
    mixed = results.mixed_note(comparison)
    text = report.render(comparison, mixed)
    for absent in ("<script", "<link", "<img", "<iframe", "src=", "@import"):
        assert absent not in text
    # Every reference inside the file points inside it (matplotlib's clip paths).
    assert all(link.startswith("#") for link in re.findall(r'href="([^"]*)"', text))
    assert all(ref.startswith("#") for ref in re.findall(r"url\(([^)]*)\)", text))
    assert text.count("<svg") == 5  # τ vs step, per set, lengths, acceptance, DDTree budgets
    for section in ("tau-vs-step", "comparison", "per-prompt-set", "provenance", "decoded-samples"):
        assert f'<section id="{section}">' in text
    assert 'id="per-dataset"' in text and ">humaneval<" in text
    assert "org/gsm8k" in text and "feedc0defeedc0de" in text  # the sets' provenance
    assert "Janet sells the &lt;eggs&gt; &amp; keeps" in text  # samples, escaped
    assert "differ from comparability group 1 (3 run(s))" in text  # the banner…
    assert '<tr class="flagged">' in text and "≠ max new tokens" in text  # …and flags


def test_compare_rewrites_the_report(three_steps, tmp_path):
    from dflash_ops.ui.compare_commands import show_comparison

    show_comparison(three_steps, plots=tmp_path / "plots", with_report=True)
    written = three_steps / report.REPORT_NAME
    assert "run-6000" in written.read_text()
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "acceptance_lengths.png", "acceptance_per_position.png", "ddtree_budgets.png",
        "tau_by_dataset.png", "tau_vs_step.png",
    ]  # fmt: skip
    pull(three_steps, 8000, 4.0)
    show_comparison(three_steps, plots=tmp_path / "plots", with_report=True)
    assert "run-8000" in written.read_text()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (make setup installs Debian's `chromium` when run as "
    "root; elsewhere: apt-get install chromium)",
)


def headless_chromium(profile: Path) -> list[str]:
    """The browser's command line, without a window, with its own profile directory."""
    return [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",  # root in a container: the sandbox needs user namespaces
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
    ]


def shoot(browser: list[str], page: Path, screenshot: Path) -> Path:
    """Chromium's screenshot of `page` (the browser's window size) into `screenshot`."""
    shot = subprocess.run(
        [*browser, f"--screenshot={screenshot}", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert screenshot.is_file(), shot.stderr[-2000:]
    return screenshot


@pytest.mark.slow
@needs_chromium
def test_chromium_renders_the_report_with_its_table(three_steps, tmp_path):
    from PIL import Image

    path = report.write(
        results.compare(results.load_runs(three_steps)), three_steps / report.REPORT_NAME
    )
    browser = [*headless_chromium(tmp_path / "profile"), "--window-size=1280,2400"]
    screenshot = shoot(browser, path, tmp_path / "report.png")
    histogram = Image.open(screenshot).convert("L").histogram()  # pixels per grey level
    dark = sum(count for level, count in enumerate(histogram) if level < 200)
    assert dark / sum(histogram) > 0.02  # text, tables and figures: not a blank page
    assert sum(1 for count in histogram if count) > 20  # anti-aliased text, lines, fills
    dom = subprocess.run(
        [*browser, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=180
    ).stdout
    table = re.search(r'<table id="per-dataset">.*?</table>', dom, re.S)
    assert table is not None
    assert table.group(0).count("<tr") == 1 + 3 * 3  # header + 3 runs × (all, gsm8k, humaneval)
    assert "humaneval" in table.group(0)
    assert dom.count("<svg") == 5
