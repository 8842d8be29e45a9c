"""`fab --help TASK` of the tasks whose harness flags come from the option table (ui.task:
harness_flags) shows what it showed when each task listed those flags by hand: the files
under fab_help/ are that output, captured at aa8e448 (the last commit with the hand-written
signatures). A change to a flag's help, default or kind shows here as a diff; when it is
meant, write the new output into the file (the test's failure prints it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_fab

SHOWN = Path(__file__).with_name("fab_help")


@pytest.mark.parametrize("task", ["run-eval", "watch", "diagnose", "extract-features"])
def test_fab_help_of_the_tasks_built_from_the_option_table_is_unchanged(task, monkeypatch):
    monkeypatch.setattr("invoke.program.pty_size", lambda: (80, 24))  # the captured width
    shown = run_fab(None, "--help", task)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == (SHOWN / f"{task}.txt").read_text()


def test_a_new_table_entry_is_a_flag_in_the_fab_help_of_the_tasks_it_names(monkeypatch):
    """Adding a harness option touches no task: the table entry alone puts its flag, help and
    kind into `fab --help` of the tasks its `tasks` names, and of no other."""
    from dflash_eval.contract import options as table

    extra = table.Option(
        "draft_rounds", "int", "rounds per draft", minimum=1, maximum=64, tasks=table.EVAL_TASKS
    )
    monkeypatch.setattr(table, "OPTIONS", (*table.OPTIONS, extra))
    monkeypatch.setattr("invoke.program.pty_size", lambda: (80, 24))
    for task in ("run-eval", "watch", "diagnose", "extract-features"):
        shown = run_fab(None, "--help", task).stdout
        assert ("--draft-rounds=INT" in shown) is (task in table.EVAL_TASKS), task
    assert "rounds per draft; from 1 to 64" in run_fab(None, "--help", "run-eval").stdout
