"""The tasks' output: wrapped to a terminal's width, never when written to a pipe or a file
(what logs, grep and the tests read), whatever COLUMNS says."""

from __future__ import annotations

import io

import pytest

from dflash_ops.ui.console import _Console

LINE = " ".join(f"/a/long/path/{index:04d}" for index in range(40))  # ~740 characters


@pytest.mark.parametrize("columns", ["40", "200", None])
def test_output_to_a_pipe_keeps_each_line_whole(monkeypatch, columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    out = io.StringIO()
    _Console(file=out, highlight=False).print(LINE)
    assert out.getvalue() == LINE + "\n"


def test_a_terminal_still_gets_lines_of_its_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    out = io.StringIO()
    _Console(file=out, force_terminal=True, color_system=None, highlight=False).print(LINE)
    lines = out.getvalue().splitlines()
    assert len(lines) > 1 and max(len(line) for line in lines) <= 40
    assert " ".join(out.getvalue().split()) == LINE
