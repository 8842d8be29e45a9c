"""The harness's option table (dflash_eval.contract.options) is the one declaration of each run
option: the harness's flags, EvalOptions, the workstation's checks and argv, and the fab tasks'
parameters and help all agree with it. A fab task's harness flags are made from the table
(ui.task.harness_flags, through the signature invoke reads); these tests pin what invoke sees
to the table."""

from __future__ import annotations

import copy
import dataclasses
import inspect

import pytest
from dflash_eval.cli import _eval_options
from dflash_eval.contract import options as table
from dflash_eval.contract.parser import build_parser
from dflash_eval.run.options import EvalOptions
from invoke.exceptions import ParseError

import fabfile
from dflash_ops.core.errors import OpsError
from dflash_ops.evaluation.harness_options import checked, harness_args

TASKS = {
    table.RUN_EVAL: fabfile.run_eval,
    table.WATCH: fabfile.watch,
    table.EXTRACT_FEATURES: fabfile.extract_features,
    table.DIAGNOSE: fabfile.diagnose,
}
# The tasks' help where an option's meaning is narrower than run-eval's.
HELP_OVERRIDES = {
    table.EXTRACT_FEATURES: {"num_prompts", "block_size"},
    table.DIAGNOSE: {"num_prompts"},
}
REQUIRED = ["--checkpoint", "c", "--target", "t"]


def _unset(option: table.Option) -> object:
    return False if option.kind == "switch" else None


def task_arguments(task) -> dict:
    """The task's invoke Arguments (invoke consumes the help dict it reads: a copy here)."""
    fresh = copy.copy(task)
    fresh.help = dict(task.help)
    return {argument.name: argument for argument in fresh.get_arguments()}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_each_fab_task_takes_exactly_its_table_options_unset_by_default(name):
    task = TASKS[name]
    parameters = inspect.signature(task.body).parameters
    wanted = {option.name: _unset(option) for option in table.for_task(name)}
    found = {
        parameter: parameters[parameter].default
        for parameter in parameters
        if parameter in table.BY_NAME and name in table.BY_NAME[parameter].tasks
    }
    # Unset means "the harness's default": the default itself is written in the table only.
    assert found == wanted


@pytest.mark.parametrize("name", sorted(TASKS))
def test_each_fab_task_shows_the_tables_help_and_numbers_as_numbers(name):
    task = TASKS[name]
    arguments = task_arguments(task)
    for option in table.for_task(name):
        if option.name not in HELP_OVERRIDES.get(name, set()):
            assert arguments[option.name].help == table.help_text(option)
        if option.kind == "int":
            assert arguments[option.name].kind is int  # fab --help: --max-new-tokens=INT
    assert "(default 256)" in arguments["max_new_tokens"].help


def test_a_bad_number_on_the_fab_command_line_is_one_line_naming_the_flag():
    arguments = task_arguments(fabfile.run_eval)
    with pytest.raises(
        ParseError,
        match=r"^--max-new-tokens: expected a whole number from 1 to 1048576 tokens, found '0'$",
    ):
        arguments["max_new_tokens"].set_value("0")
    with pytest.raises(
        ParseError,
        match=r"^--block-size: expected a whole number from 2 to 1024 tokens, found 'many'$",
    ):
        arguments["block_size"].set_value("many")
    arguments["threads"].set_value("4")
    assert arguments["threads"].value == 4


def test_harness_flags_and_eval_options_are_the_tables():
    args = build_parser().parse_args(["eval", *REQUIRED, "--out", "o"])
    options = _eval_options(args, given={})
    fields = {field.name for field in dataclasses.fields(EvalOptions)}
    for option in table.for_command("eval"):
        assert getattr(args, option.name) == table.default(option.name) or option.required
        assert (option.name in fields) == option.stored
    assert options.max_new_tokens == 256 and options.ddtree is None  # None: the drafter's own
    assert options.thinking is False and options.cache_dir == table.CACHE_DIR


def test_a_bad_value_is_refused_by_the_harness_and_by_the_workstation_alike(capsys):
    with pytest.raises(SystemExit) as exit_status:
        build_parser().parse_args(["plan", *REQUIRED, "--ddtree", "4,0"])
    assert exit_status.value.code == 2
    assert "--ddtree: expected a whole number from 1 to 4096 tokens, found '0'" in (
        capsys.readouterr().err
    )
    ddtree = r"^--ddtree: expected a whole number from 1 to 4096 tokens, found '0'$"
    with pytest.raises(OpsError, match=ddtree):
        checked({"ddtree": "4,0"})
    with pytest.raises(OpsError, match=r"^--dtype: expected one of float32, bfloat16"):
        checked({"dtype": "float16"})
    with pytest.raises(OpsError, match="not harness options: checkpoint"):
        checked({"checkpoint": "/elsewhere"})  # run-eval chooses it, not the user


def test_the_argv_the_workstation_sends_means_the_same_run_to_the_harness():
    given = {
        "num_prompts": "3",
        "max_new_tokens": 24,
        "ddtree": "4,8",
        "target_layer_ids": "1, 9",
        "accept_default": "rope",
        "thinking": "on",
        "target_dtype": "float32",
        "no_cache": True,
        "per_block": False,
        "chunk_anchors": "2",
    }
    argv = harness_args(given)
    assert "--per-block" not in argv and argv[argv.index("--no-cache") + 1] == "--chunk-anchors"
    options = _eval_options(build_parser().parse_args(["eval", *REQUIRED, "--out", "o", *argv]), {})
    assert (options.num_prompts, options.max_new_tokens, options.chunk_anchors) == (3, 24, 2)
    assert (options.ddtree, options.target_layer_ids) == ([4, 8], [1, 9])
    assert (options.accept_default, options.thinking, options.target_dtype) == (
        ["rope"],
        True,
        "float32",
    )
    assert options.cache_dir is None and options.per_block is False


def test_a_new_table_entry_is_a_flag_of_the_tasks_that_take_it_and_reaches_their_body(
    monkeypatch,
):
    """What adding a harness option asks of the workstation: the table entry, nothing else."""
    from fabric import Config
    from invoke import Context

    from dflash_ops.ui.task import harness_flags, ops_task

    extra = table.Option("draft_note", "text", "a note kept with the run", tasks=(table.RUN_EVAL,))
    monkeypatch.setattr(table, "OPTIONS", (*table.OPTIONS, extra))
    received: dict = {}

    @ops_task(groups=(harness_flags(table.RUN_EVAL),))
    def probe(c, step=None, harness_options=None):
        received.update(step=step, **harness_options)

    arguments = task_arguments(probe)
    assert arguments["draft_note"].help == table.help_text(extra)
    assert "harness_options" not in arguments and "step" in arguments
    probe(Context(config=Config()), step="7", draft_note="kept")
    assert received["step"] == "7" and received["draft_note"] == "kept"
    assert received["max_new_tokens"] is None  # unset: the harness's default
    watch_like = ops_task(groups=(harness_flags(table.WATCH),))(lambda c, harness_options=None: 0)
    assert "draft_note" not in task_arguments(watch_like)
