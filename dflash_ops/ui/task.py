"""The decorator that makes a Fabric task out of a library call.

Expected failures (`OpsError`) become one clear message on stderr and exit status 1, without a
traceback; Ctrl-C exits 130 quietly; anything else keeps its traceback (it is a bug).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

from dflash_eval import options as table
from fabric import task
from fabric.tasks import Task
from invoke.exceptions import Exit, ParseError
from invoke.parser import Argument

from dflash_ops.core.errors import OpsError

INVENTORY_HELP = "inventory file (default: $DFLASH_INVENTORY, else ./inventory.yaml)"
# The numeric harness options the tasks pass on, by keyword (dflash_eval.options).
NUMBERS = {
    option.name: option
    for option in table.OPTIONS
    if option.tasks and option.kind in ("int", "float")
}


class _NumberArgument(Argument):
    """A harness option's flag that is parsed and range-checked by the harness's table as
    invoke reads it: a bad value is one line (ParseError), not int()'s traceback."""

    def __init__(self, option: table.Option, **kwargs) -> None:
        # invoke's help shows =INT for int and nothing for any other kind but str.
        super().__init__(kind=int if option.kind == "int" else str, **kwargs)
        self.option = option

    def set_value(self, value: object, cast: bool = True) -> None:
        try:
            parsed = table.parse(self.option, value) if cast else value
        except ValueError as error:
            raise ParseError(f"{self.option.flag}: {error}") from None
        super().set_value(parsed, cast=False)


class _OpsTask(Task):
    """A Fabric task whose harness-option flags take the harness's kinds."""

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        return [
            _NumberArgument(
                NUMBERS[argument.name],
                names=argument.names,
                default=argument.default,
                help=argument.help,
                attr_name=argument.attr_name,
            )
            if argument.name in NUMBERS
            else argument
            for argument in super().get_arguments(ignore_unknown_help)
        ]


def ops_task(help: dict[str, str] | None = None, **task_options) -> Callable:
    """`@task` with OpsError handling; an `inventory` parameter gets its standard help."""

    def decorate(body: Callable) -> Callable:
        @functools.wraps(body)
        def run(*args, **kwargs):
            try:
                return body(*args, **kwargs)
            except OpsError as exc:
                from rich.markup import escape

                from dflash_ops.ui.console import errors

                errors.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
                raise Exit(code=1) from None
            except KeyboardInterrupt:
                raise Exit("interrupted", code=130) from None

        takes_inventory = "inventory" in inspect.signature(body).parameters
        helps = {**({"inventory": INVENTORY_HELP} if takes_inventory else {}), **(help or {})}
        # Long flags only: invoke's automatic one-letter flags (-h for --host…) confuse more
        # than they save.
        return task(help=helps, auto_shortflags=False, klass=_OpsTask, **task_options)(run)

    return decorate
