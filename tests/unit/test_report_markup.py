"""The HTML report never turns text from a results file into markup: every string a pulled
run carries (results.json, run.json, its directory name), and every number the readers
accept as text, is replaced by a script payload; the report is rendered, and a real headless
Chromium loads it: no script runs, and the payload is on the page as text."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dflash_ops.evaluation import compare_rows, results
from dflash_ops.ui import report
from tests.unit.test_report import headless_chromium, needs_chromium, pull

TITLE = "DFlash drafter evaluation report"
# Each route to script a page offers: a script element, an event handler, a javascript: URL,
# markup that closes the element it sits in first, and an attribute breakout.
PAYLOAD = (
    "</code></td></tr></table><script>document.title='pwned'</script>"
    "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
    "<a href=\"javascript:document.title='pwned'\">x</a>'\"><svg onload=document.title='pwned'>"
)


def readers_accept(run: Path) -> bool:
    """Whether `compare` and every table of the report still read this run's files."""
    try:
        loaded = results.load_runs(run.parent)
        mine = [r for r in loaded if r.directory == run]
        if not mine or mine[0].results is None:
            return False
        comparison = results.compare(loaded)
        compare_rows.table_rows(comparison)
        compare_rows.dataset_rows(comparison)
        compare_rows.overlap_notes(comparison)
    except (TypeError, ValueError, KeyError, results.ResultsError):
        return False
    return True


def poison(run: Path, name: str) -> int:
    """Put the payload into every leaf of `run`'s JSON file `name` that the readers still
    accept with it (strings always; numbers where text is read); the number poisoned."""
    path = run / name
    document = json.loads(path.read_text())
    poisoned = 0
    for holder, key in list(_leaves(document)):
        original = holder[key]
        holder[key] = PAYLOAD
        path.write_text(json.dumps(document))
        if readers_accept(run):
            poisoned += 1
        else:
            holder[key] = original
    path.write_text(json.dumps(document))
    return poisoned


def _leaves(value: Any):
    """(container, key) of every string or number inside `value`, depth first."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, inner in items:
        if isinstance(inner, dict | list):
            yield from _leaves(inner)
        elif isinstance(inner, str | int | float) and not isinstance(inner, bool):
            yield value, key


@pytest.fixture(scope="module")  # read-only for its tests; poisoning leaf by leaf takes seconds
def poisoned_report(tmp_path_factory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("poisoned") / "results"
    pull(root, 2000, 2.0)
    pull(root, 6000, 3.05)  # carries decoded samples
    hostile = root / f"run-{PAYLOAD.replace('/', '')}"
    (root / "run-6000").rename(hostile)
    count = sum(
        poison(run, name)
        for run in (root / "run-2000", hostile)
        for name in ("results.json", "run.json")
    )
    comparison = results.compare(results.load_runs(root))
    return report.write(comparison, root / report.REPORT_NAME), count


def test_every_string_a_run_carries_reaches_the_report_as_text(poisoned_report):
    path, count = poisoned_report
    assert count > 100  # the payload sits in every string field, not a chosen few
    text = path.read_text()
    for live in ("<script>document", "<img src=x", '<a href="javascript', "<svg onload"):
        assert live not in text
    assert "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in text
    # Among the fields: the bootstrap settings, the samples, the provenance, the run's id.
    settings = "bootstrap over &lt;/code&gt;"
    assert settings in text and 'class="sample"' in text and "run.host" in text


@pytest.mark.slow
@needs_chromium
def test_chromium_runs_no_script_from_a_poisoned_report(poisoned_report, tmp_path):
    path, _ = poisoned_report
    dom = subprocess.run(
        [
            *headless_chromium(tmp_path / "profile"),
            "--virtual-time-budget=3000",  # let any handler (onerror, onload) fire first
            "--dump-dom",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    ).stdout
    assert f"<title>{TITLE}</title>" in dom  # no script set document.title
    assert 'data-pwned="1"' not in dom and "pwned</title>" not in dom  # no handler ran
    for live in ("<script", "<img", '<a href="javascript', "<svg onload"):
        assert live not in dom  # no element made of the payload…
    assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;" in dom  # …shown as text
