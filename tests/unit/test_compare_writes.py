"""`fab compare` reads only: in every format it writes nothing unless asked (`--plots [DIR]`,
`--report`), so a program reading its JSON leaves the results directory as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_fab
from tests.unit.test_inert_text import _inventory
from tests.unit.test_report import pull


@pytest.fixture(scope="module")
def pulled(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("compare") / "results"
    pull(root, 2000, 2.0)
    pull(root, 4000, 3.0)
    return root, _inventory(root.parent, root)


def _files(root: Path) -> dict[str, float]:
    return {str(path): path.stat().st_mtime_ns for path in sorted(root.rglob("*"))}


@pytest.mark.parametrize("fmt", ["table", "json", "csv", "markdown"])
def test_compare_in_any_format_writes_nothing(pulled, fmt):
    root, inventory = pulled
    before = _files(root)
    shown = run_fab(inventory, "compare", "--format", fmt)
    assert shown.returncode == 0, shown.stderr
    assert _files(root) == before
    assert "\nreport: " not in shown.stdout + shown.stderr
    assert "\nplot: " not in shown.stdout + shown.stderr


def test_the_table_says_how_to_get_the_plots_and_the_report(pulled):
    shown = run_fab(pulled[1], "compare")
    assert "plots and the HTML report: add --plots and --report" in shown.stdout


def test_plots_and_report_are_written_when_asked(pulled, tmp_path):
    root, inventory = pulled
    asked = run_fab(inventory, "compare", "--format", "json", "--plots", "--report")
    assert asked.returncode == 0, asked.stderr
    assert (root / "plots" / "tau_vs_step.png").stat().st_size > 1000
    assert f"report: {root / 'report.html'}" in asked.stderr
    assert (root / "report.html").stat().st_size > 1000
    elsewhere = run_fab(inventory, "compare", "--plots", str(tmp_path))
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert (tmp_path / "tau_vs_step.png").exists()
