"""Training metrics beside τ where results are read (no hosts): compare's table, JSON and
CSV carry a column per logged field, the report has its section and the figure that puts τ
and a training metric on one step axis, and --train-metric names one that exists."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from dflash_ops.core.errors import ResultsError
from dflash_ops.evaluation import figures, results
from dflash_ops.ui import report
from dflash_ops.ui.compare_commands import show_comparison
from tests.lab.test_output import rendered
from tests.training_samples import LOGGED, pull


@pytest.fixture
def pulled(tmp_path) -> Path:
    root = tmp_path / "results"
    pull(root, 2000, 2.0, LOGGED[2000])
    pull(root, 4000, 3.0, LOGGED[4000])
    pull(root, 6000, 3.5, None)  # its training run had not logged step 6000 yet
    return root


def test_json_and_csv_carry_each_field_at_each_step(pulled, capsys):
    show_comparison(pulled, fmt="json")
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["step"], r["train.loss"], r["train.acc"]) for r in runs] == [
        (2000, 2.5, 0.25),
        (4000, 1.75, "nan"),
        (6000, None, None),
    ]
    show_comparison(pulled, fmt="csv")
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["step"], r["train.loss"], r["train.acc"]) for r in rows] == [
        ("2000", "2.5", "0.25"),
        ("4000", "1.75", "nan"),
        ("6000", "", ""),
    ]


@pytest.mark.parametrize("wide", [False, True])
def test_the_table_shows_them_beside_tau(pulled, wide):
    from dflash_ops.ui.compare_view import print_comparison

    comparison = results.compare(results.load_runs(pulled))
    text = "\n".join(rendered(200, lambda on: print_comparison(comparison, "table", wide, on)))
    header = next(line for line in text.splitlines() if "loss" in line)
    assert header.index("loss") < header.index("acc", header.index("loss"))
    assert re.search(r"2000 .*2\.000.* 2\.5 +0\.25\b", text)
    assert re.search(r"4000 .*3\.000.* 1\.75 +nan\b", text)
    assert re.search(r"6000 .*3\.500.* - +-", text)
    narrow = rendered(80, lambda on: print_comparison(comparison, "table", wide, on))
    assert max(map(len, narrow)) <= 80  # the compact table leaves them out first


def test_the_report_has_the_section_and_the_shared_step_axis_figure(pulled):
    comparison = results.compare(results.load_runs(pulled))
    page = report.render(comparison, training_metric="acc")
    section = page[page.index('id="training-metrics"') :]
    assert "/w/m.jsonl (jsonl)" in page
    assert re.search(r"<td>2000</td><td>2\.000</td><td>2\.5</td><td>0\.25</td>", section)
    assert 'id="figure-tau_and_training"' in page
    assert "training metric acc vs step" in page
    assert "6000</td><td>3.500" not in section  # a run without training metrics is not listed


def test_no_training_metrics_no_section_and_no_figure(tmp_path):
    pull(tmp_path, 2000, 2.0, None)
    comparison = results.compare(results.load_runs(tmp_path))
    assert "tau_and_training" not in figures.build(comparison)
    assert 'id="training-metrics"' not in report.render(comparison)


def test_a_train_metric_no_run_logged_is_one_line(pulled):
    comparison = results.compare(results.load_runs(pulled))
    with pytest.raises(
        ResultsError,
        match=r"^--train-metric lr: no compared run has it logged; "
        r"they have: loss, acc$",
    ):
        figures.build(comparison, "lr")
