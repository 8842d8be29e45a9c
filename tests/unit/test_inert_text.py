"""Text from results files and hosts stays data on the terminal and in spreadsheets: control
characters (escape sequences, bidi overrides) are shown escaped, rich markup in a name prints
as itself, a CSV cell that a spreadsheet would run as a formula is written as text, and a tag
is checked where it is given and where it is read back."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from dflash_ops.core.errors import OpsError
from dflash_ops.core.records import RecordError, parse_record
from dflash_ops.core.text import MAX_TAG, check_tag, csv_cell, inert
from dflash_ops.evaluation import figures, results
from dflash_ops.evaluation.records import RunParams
from dflash_ops.evaluation.run_listing import Run
from dflash_ops.remote.checks import Row, Status
from dflash_ops.ui import cli, eval_view
from dflash_ops.ui.console import check_table, console
from dflash_ops.ui.diagnose_view import StderrView
from dflash_ops.ui.output import Column, as_csv, as_markdown, field
from dflash_ops.ui.staging_view import transfer_bars
from tests.conftest import run_fab
from tests.unit.test_report import pull

REPO = Path(__file__).resolve().parents[2]
# Clear the screen, set the window's title, reverse what follows, a C1 CSI, a carriage
# return (it overwrites the line), markup that rich would read (a bare closing tag makes it
# raise) and an emoji code.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07\u202eevil\u2066\x9b31m\rfake [red]x[/red] [/] :fire:"
SHOWN = r"\x1b[2J\x1b]0;pwned\x07\u202eevil\u2066\x9b31m\rfake [red]x[/red] [/] :fire:"
# Every character a terminal could act on, but newline and tab (layout, harmless).
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
FORMULA = '=HYPERLINK("http://attacker.example/","click")'


def test_inert_escapes_every_control_character_visibly():
    dangerous = [*map(chr, range(0x20)), *map(chr, range(0x7F, 0xA0))]
    dangerous += [*map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))]
    for character in dangerous:
        escaped = inert(f"a{character}b")
        assert escaped.startswith("a\\") and escaped.endswith("b") and escaped.isprintable()
    assert inert("\x1b[2J") == r"\x1b[2J" and inert("\u202e") == r"\u202e"
    assert inert("a\nb\tc") == r"a\nb\tc"  # a name is one line
    assert inert("a\nb\tc\x1b", lines=True) == "a\nb\tc\\x1b"  # a log keeps its lines
    assert inert("τ ünïcode [ok] 3.2") == "τ ünïcode [ok] 3.2"


def test_csv_cells_that_a_spreadsheet_would_run_are_written_as_text():
    for formula in ("=1+2", "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\t=1"):
        assert csv_cell(formula) == "'" + formula
    assert csv_cell("\r=1") == r"'\r=1"
    for kept in (-1.5, 0, 3, "-1.5", "+2", "-1e-05", "gsm8k", "a\nb\tc", "", None):
        assert csv_cell(kept) == kept
    # a carriage return would end the row for most readers (the writer ends rows with \n)
    assert csv_cell("a\rb\x1b[2J") == r"a\rb\x1b[2J"
    written = as_csv([{"delta": -0.25, "name": "-x", "number": "-2", "tag": FORMULA}])
    row = next(csv.DictReader(io.StringIO(written)))
    assert row == {"delta": "-0.25", "name": "'-x", "number": "-2", "tag": "'" + FORMULA}


def test_a_markdown_cell_stays_one_cell_on_one_line():
    table = as_markdown([{"name": "a\nb|c\x1b"}], [Column("name", field("name"))])
    assert table.splitlines()[2] == r"| a\nb\|c\x1b |"


def test_a_tag_is_printable_and_bounded():
    assert check_tag("v5-lr3e-4") == "v5-lr3e-4" and check_tag(None) is None
    assert check_tag(FORMULA) == FORMULA  # printable: CSV writing keeps it inert
    for bad, why in (
        ("", "an empty text"),
        ("x" * (MAX_TAG + 1), f"{MAX_TAG + 1} characters"),
        ("a\x1b[2Jb", r"'a\x1b[2Jb', which holds characters that are not printable"),
        ("a\u202eb", r"'a\u202eb'"),
    ):
        with pytest.raises(OpsError) as caught:
            check_tag(bad)
        message = str(caught.value)
        assert message.startswith("--tag: expected printable text") and why in message
        assert not RAW.search(message) and "\n" not in message


def _hostile(value: Any, old: str, new: str) -> Any:
    """`value` with `old` replaced by `new` in every key and string."""
    if isinstance(value, dict):
        return {_hostile(k, old, new): _hostile(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_hostile(item, old, new) for item in value]
    return value.replace(old, new) if isinstance(value, str) else value


def _inventory(tmp_path: Path, root: Path) -> Path:
    """The example inventory with its results here (compare and export connect to no host)."""
    document = yaml.safe_load((REPO / "inventory.yaml").read_text())
    document["local"] = {"results": str(root)}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def hostile_results(tmp_path) -> Path:
    """Two runs whose training run, host, prompt set and prompt ids (and one's tag) come
    with escape sequences and markup; a third run's tag is a formula."""
    root = tmp_path / "results"
    pull(root, 2000, 2.0, checkpoint={"training_run": f"v4{HOSTILE}"})
    pull(root, 6000, 3.05, checkpoint={"training_run": f"v4{HOSTILE}"})  # with samples
    for directory in root.iterdir():
        path = directory / "results.json"
        path.write_text(json.dumps(_hostile(json.loads(path.read_text()), "gsm8k", HOSTILE)))
        run = json.loads((directory / "run.json").read_text())
        (directory / "run.json").write_text(json.dumps({**run, "host": f"eval{HOSTILE}"}))
    return root


def _clean(output: str) -> None:
    raw = RAW.findall(output)
    assert not raw, f"raw control characters reached the terminal: {raw}"


@pytest.mark.parametrize(
    "flags",
    [(), ("--wide", "--samples", "2"), ("--format", "csv")],
    ids=["table", "wide-with-samples", "csv"],
)
def test_compare_shows_names_from_results_files_escaped_and_literal(
    hostile_results, tmp_path, flags
):
    inventory = _inventory(tmp_path, hostile_results)
    shown = run_fab(inventory, "compare", *flags)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    _clean(shown.stdout + shown.stderr)
    # each name whole, escaped (a newline in a name would fake a row: shown as \n)
    assert SHOWN in shown.stdout
    if "--samples" in flags:
        assert f"{SHOWN}-3" in shown.stdout  # the prompt id of the decoded sample


def test_a_tag_read_back_that_is_no_tag_is_flagged_and_shown_escaped(hostile_results, tmp_path):
    run_file = hostile_results / "run-6000" / "run.json"
    run_file.write_text(json.dumps({**json.loads(run_file.read_text()), "tag": HOSTILE}))
    shown = run_fab(_inventory(tmp_path, hostile_results), "compare")
    assert shown.returncode == 0, shown.stderr
    _clean(shown.stdout + shown.stderr)
    assert "skipped" in shown.stdout and "tag: value error, not a tag" in shown.stdout


def test_eval_status_shows_a_host_run_with_a_hostile_tag_broken_and_escaped(capsys):
    params = json.dumps({"step": 2000, "started": 1.0, "tag": HOSTILE, "kind": "eval"})
    with pytest.raises(RecordError) as caught:  # how a listing reads each run's params.json
        parse_record(params, "params.json", RunParams)
    problem = str(caught.value)
    assert problem.startswith(r"params.json: tag: value error, not a tag: '\x1b[2j")
    assert parse_record(json.dumps({"tag": "v5"}), "params.json", RunParams).tag == "v5"
    runs = [
        Run("r-bad", "eval", "broken", None, {}, None, problem=problem),
        Run(f"r-[red]{HOSTILE}", "eval", "failed", 1, {"step": 4000, "tag": "v5"}, 3.0, HOSTILE),
    ]
    for fmt in ("table", "csv", "markdown", "json"):
        eval_view.show_runs(runs, fmt, wide=True)
        out = capsys.readouterr().out
        _clean(out)
    eval_view.show_runs(runs, "table", wide=True)
    assert "r-[red]" in capsys.readouterr().out  # markup in a run id prints as itself


def test_harness_events_and_step_lines_are_shown_escaped(capsys):
    view = eval_view.PrefixedView("eval")
    on_event = view.follow("run")
    on_event({"event": "warning", "message": f"first line\n{HOSTILE}"})
    on_event({"event": "progress", "phase": HOSTILE, "done": 4, "total": 4})  # its end
    on_event({"event": "status", "message": HOSTILE})
    line = eval_view.step_line(2000, OpsError(f"host said {HOSTILE}"))
    eval_view.console.print(line)
    out = capsys.readouterr().out
    _clean(out)
    assert out.count(SHOWN) == 3 and "first line\n" in out  # a message keeps its lines
    assert r"host said \x1b[2J\x1b]0;pwned" in out


@pytest.mark.parametrize(
    "task",
    [("run-eval", "--step", "2000"), ("watch", "--once"), ("compare",), ("export",)],
    ids=lambda task: task[0],
)
@pytest.mark.parametrize("tag", ["a\x1b]0;pwned\x07", "x" * (MAX_TAG + 1)], ids=["control", "long"])
def test_a_bad_tag_is_one_line_naming_the_flag_before_any_host_is_asked(tmp_path, task, tag):
    document = yaml.safe_load((REPO / "inventory.yaml").read_text())
    for host in document["hosts"].values():  # were any asked, it would be on loopback
        host["address"] = "127.0.0.1"
    document["local"] = {"results": str(tmp_path / "results")}
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(document))
    refused = run_fab(inventory, *task, "--tag", tag)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    message = refused.stderr.strip()
    assert "\n" not in message and message.startswith("error: --tag: expected printable text")
    _clean(message)


def test_export_and_csv_write_formulas_as_text_and_numbers_as_numbers(hostile_results, tmp_path):
    for directory in hostile_results.iterdir():
        run_file = directory / "run.json"
        run_file.write_text(json.dumps({**json.loads(run_file.read_text()), "tag": FORMULA}))
        path = directory / "results.json"
        document = json.loads(path.read_text())
        path.write_text(json.dumps(_hostile(document, "humaneval", "@SUM(1+1)*cmd")))
    inventory = _inventory(tmp_path, hostile_results)
    out = tmp_path / "tidy.csv"
    exported = run_fab(inventory, "export", "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    shown = run_fab(inventory, "compare", "--format", "csv")
    for text in (out.read_text(), shown.stdout):
        rows = list(csv.DictReader(io.StringIO(text)))
        assert rows and all(row["tag"] == "'" + FORMULA for row in rows)
        cells = [cell for row in rows for cell in row.values()]
        assert not [c for c in cells if c[:1] in ("=", "+", "@") or re.match(r"-[^\d.]", c)]
    rows = list(csv.DictReader(out.open()))
    assert {row["prompt_set"] for row in rows} >= {"'@SUM(1+1)*cmd"}
    values = [row["value"] for row in rows if row["value"]]
    assert values and all(isinstance(float(value), float) for value in values)


def test_plot_labels_are_text_not_maths_nor_control_characters(tmp_path):
    root = tmp_path / "results"
    for step in (2000, 4000):  # `$…$` is maths to matplotlib: this one would not parse
        pull(root, step, 2.0, checkpoint={"training_run": f"v$x^{{$ {HOSTILE}"})
    comparison = results.compare(results.load_runs(root))
    for figure in figures.build(comparison).values():
        svg = figures.svg_text(figure)
        _clean(svg)
        assert "v$x^{$ " in svg and r"\x1b[2J" in svg


def test_a_transfer_label_from_a_host_is_text(capsys):
    with transfer_bars() as bar_for:
        bar_for("e:/data/s/[/]\x1b[2J.pt", 10)  # the label keeps the file's name
    out = capsys.readouterr().out
    _clean(out)
    assert r"e:[/]\x1b[2J.pt" in out


def test_check_hosts_and_diagnose_lines_show_what_a_host_said_as_text(capsys):
    detail = f"python says: {HOSTILE}\nsecond line"
    console.print(check_table([Row("eval", "venv", Status.FAIL, detail)], "checks"))
    view = StderrView()
    view.follow("run")({"event": "error", "message": HOSTILE})
    view.finished(Run("r-[/]x", "eval", "failed", 1, {}, 5.0), [], Path(f"results/{HOSTILE}"))
    captured = capsys.readouterr()
    _clean(captured.out + captured.err)
    assert SHOWN in captured.out and "second line" in captured.out
    assert captured.err.count(SHOWN) == 2 and "r-[/]x" in captured.err


def test_dflash_ops_results_list_shows_what_run_files_say_escaped(hostile_results):
    run_file = hostile_results / "run-2000" / "run.json"
    run_file.write_text(json.dumps({**json.loads(run_file.read_text()), "state": HOSTILE}))
    listed = CliRunner().invoke(cli.main, ["results", "list", "--results", str(hostile_results)])
    assert listed.exit_code == 0, listed.output
    _clean(listed.output)
    assert f"step 2000  {SHOWN}" in listed.output
