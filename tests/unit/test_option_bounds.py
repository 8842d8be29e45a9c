"""Every number from outside has both bounds and a unit where it has one, and one parser reads
it (dflash_eval.contract.numbers): the harness's run options (the option table), the workstation's
own flags and the values built in code. A hostile value is one line naming the flag, the range
with its unit and the value found, on the harness and on the workstation alike, before
anything is staged. (Unit tier: no sshd, fab run in-process.)"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import pytest
from dflash_eval.contract import options as table
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.numbers import parse_number, span
from dflash_eval.contract.parser import build_parser
from dflash_eval.walk.sampling_settings import Sampling
from fabric.main import program

import fabfile
from dflash_ops.core.arguments import MAX_COUNT, MAX_RETRIES, parse_count, parse_step, parse_steps
from dflash_ops.core.errors import OpsError
from dflash_ops.core.units import parse_bwlimit, parse_size
from dflash_ops.evaluation.harness_options import PASSED, checked
from dflash_ops.evaluation.watch import parse_interval
from dflash_ops.ui.fab_help import WATCH_HELP

NUMERIC = [option for option in table.OPTIONS if option.kind in ("int", "float", "ints")]
REQUIRED = ["--checkpoint", "c.pt", "--target", "t"]
# Hostile text no option takes: too big, not finite, not decimal, not ASCII, empty, too long.
HOSTILE = ["1e400", "-1e400", "inf", "-inf", "nan", "0x10", "1_000", "", " ", "1" * 5000, "١٢"]


def _message(option: table.Option, value: str) -> str:
    kind = "a finite number" if option.kind == "float" else "a whole number"
    return f"{option.flag}: expected {kind} {table.span_text(option)}, found "


def _harness_refusal(option: table.Option, value: str, capsys) -> str:
    """The one error line of `python -m dflash_eval COMMAND --FLAG=VALUE` (eval, or the
    first command that takes the option: features for --gpu-memory)."""
    command = "eval" if "eval" in option.commands else option.commands[0]
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([command, *REQUIRED, "--out", "o", f"{option.flag}={value}"])
    assert exited.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    return line


def test_every_number_has_both_bounds_and_whole_ones_fit_int64():
    for option in NUMERIC:
        assert option.minimum is not None and option.maximum is not None, option.name
        assert option.minimum < option.maximum, option.name
        if option.kind != "float":
            assert option.maximum <= table.INT64_MAX, option.name
    counted = {option.name: option.unit for option in NUMERIC if option.unit}
    assert counted["max_new_tokens"] == "tokens" and counted["num_prompts"] == "prompts"
    assert counted["threads"] == "threads" and counted["samples"] == "walks"


@pytest.mark.parametrize("option", NUMERIC, ids=lambda option: option.name)
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_text_is_one_line_on_the_harness_and_the_workstation(option, value, capsys):
    """The same refusal from the harness's argparse, the workstation's check before staging
    and the parser of values built in code."""
    if option.kind == "ints" and not value.strip():
        assert table.parse(option, value) == []  # an empty list: none (--ddtree '')
        return
    expected = _message(option, value)
    line = _harness_refusal(option, value, capsys)
    assert f"argument {expected}" in line
    assert len(line) < 300  # a 5000-digit value is cut, not echoed
    if option.name in PASSED:
        with pytest.raises(OpsError) as refused:
            checked({option.name: value})
        assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)
    with pytest.raises(HarnessError, match=f"^{re.escape(expected)}"):
        table.parse(option, value)


@pytest.mark.parametrize("option", NUMERIC, ids=lambda option: option.name)
def test_just_beyond_each_bound_is_refused_and_the_bounds_themselves_pass(option, capsys):
    whole = option.kind != "float"
    high = int(option.maximum) if whole else option.maximum
    beyond = [str(high + 1) if whole else str(high * 1.0001), str(10**12 * (high + 1))]
    low = int(option.minimum) if whole else option.minimum
    beyond.append(str(low - 1))
    for value in beyond:
        line = _harness_refusal(option, value, capsys)
        assert f"found '{value}'" in line and table.span_text(option) in line
    parsed_high = table.parse(option, str(high))
    assert parsed_high == ([high] if option.kind == "ints" else high)
    if not option.above_minimum:
        assert table.parse(option, str(low)) in (low, [low])


@pytest.mark.parametrize("option", NUMERIC, ids=lambda option: option.name)
def test_minus_zero_is_zero_where_zero_is_allowed(option):
    if option.minimum > 0 or option.above_minimum:
        with pytest.raises(HarnessError, match=re.escape(_message(option, "-0"))):
            table.parse(option, "-0")
        return
    parsed = table.parse(option, "-0")
    number = parsed[0] if option.kind == "ints" else parsed
    assert number == 0 and math.copysign(1, number) == 1  # never -0.0 in the argv or results


def test_ten_to_the_twelve_is_refused_everywhere_but_for_a_seed_and_bytes():
    taken = [option.name for option in NUMERIC if _accepts(option, str(10**12))]
    assert taken == ["seed", "gpu_memory"]  # a 1 TB cap per GPU is odd, not absurd


def _accepts(option: table.Option, value: str) -> bool:
    try:
        table.parse(option, value)
    except HarnessError:
        return False
    return True


def test_the_help_shows_each_range_and_unit_in_argparse_and_fab():
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    actions = {action.dest: action.help for action in commands.choices["eval"]._actions}
    for option in NUMERIC:
        if "eval" in option.commands:
            assert table.span_text(option) in actions[option.name], option.name
    assert actions["max_new_tokens"].endswith("; from 1 to 1048576 tokens (default 256)")
    assert "; each from 1 to 4096 tokens" in actions["ddtree"]
    assert "; > 0 and ≤ 1 (default 1.0)" in actions["top_p"]
    assert table.help_text(table.BY_NAME["num_prompts"]).endswith("; from 1 to 100000 prompts")
    # The workstation's own counts say theirs too.
    assert "; from 0 to 1000 retries (default 2)" in WATCH_HELP["retries"]
    assert "; from 1 to 1000000 passes" in WATCH_HELP["max_passes"]


@pytest.mark.parametrize(("task", "flag"), [("compare", "--samples"), ("run-eval", "--tag")])
def test_a_flag_given_without_its_value_is_named_as_typed(
    task, flag, capsys, monkeypatch, tmp_path
):
    monkeypatch.setenv("DFLASH_INVENTORY", str(tmp_path / "none.yaml"))
    repo = str(Path(fabfile.__file__).parent)
    with pytest.raises(SystemExit) as exited:
        program.run(["fab", "-r", repo, task, flag])
    assert exited.value.code != 0
    err = capsys.readouterr().err.strip()
    assert err == f"Flag {flag} needed value and was not given one!"


def test_fab_refuses_an_out_of_range_option_before_anything_else(capsys, monkeypatch, tmp_path):
    """`fab run-eval --num-prompts 1e400` fails while invoke parses it: the inventory (here none)
    is never read, nothing is staged or deployed."""
    monkeypatch.setenv("DFLASH_INVENTORY", str(tmp_path / "none.yaml"))
    repo = str(Path(fabfile.__file__).parent)
    with pytest.raises(SystemExit) as exited:
        program.run(["fab", "-r", repo, "run-eval", "--step", "1", "--num-prompts", "1e400"])
    assert exited.value.code != 0
    err = capsys.readouterr().err.strip()
    assert err == "--num-prompts: expected a whole number from 1 to 100000 prompts, found '1e400'"


def test_values_built_in_code_are_checked_by_the_same_table():
    """Sampling.check and the runs' own checks are the table's (options.check)."""
    with pytest.raises(HarnessError, match=r"^--samples: expected a whole number from 2 to "):
        Sampling(temperature=1.0, samples=10**7).check()
    with pytest.raises(HarnessError, match=r"^--temperature: expected a finite number from 0 "):
        Sampling(temperature=math.inf).check()
    with pytest.raises(HarnessError, match="need --temperature above 0"):
        Sampling(top_k=4).check()
    Sampling(temperature=0.7, top_p=0.9, top_k=20, seed=table.INT64_MAX).check()


@pytest.mark.parametrize("value", [*HOSTILE, "-1", str(10**12)])
def test_the_workstations_own_counts_are_bounded_with_one_line(value):
    bounded = [
        ("--retries", lambda text: parse_count("--retries", text, minimum=0, maximum=MAX_RETRIES)),
        (
            "--max-passes",
            lambda text: parse_count("--max-passes", text, minimum=1, maximum=MAX_COUNT),
        ),
        ("--step", parse_step),
        ("--steps", parse_steps),
    ]
    for flag, parse in bounded:
        if flag == "--steps" and not value.strip():
            continue  # an empty list of steps is none
        with pytest.raises(OpsError, match=f"^{flag}: expected a whole number from "):
            parse(value)
    assert parse_step("1000000000") == 10**9 and parse_steps("2000, 4000") == [2000, 4000]


@pytest.mark.parametrize("value", ["1e400", "inf", "nan", "0x10", "1_000", "-1", "2e18", "1" * 500])
def test_sizes_rates_and_intervals_are_bounded_with_one_line(value):
    with pytest.raises(ValueError, match=r"^not a size: .*at most 1 EiB\)$"):
        parse_size(value)
    with pytest.raises(ValueError, match=r"^not a bandwidth: .* from 64 KiB/s to 1 EiB/s"):
        parse_bwlimit(value)
    with pytest.raises(OpsError, match=r"^--interval: expected"):
        parse_interval(value + "s")
    assert parse_size("2g") == 2 << 30 and parse_bwlimit("200m/s") == 200 << 20


def test_the_range_wording_is_one_function():
    assert span(1, 1024, "tokens") == "from 1 to 1024 tokens"
    assert span(0, 1, above_minimum=True) == "> 0 and ≤ 1"
    assert span(0, None, "seconds") == "≥ 0 seconds" and span(None, None) == ""
    with pytest.raises(HarnessError, match=r"^n: expected a finite number > 0 and ≤ 1, found 0$"):
        parse_number("n", 0, minimum=0, maximum=1, above_minimum=True)
