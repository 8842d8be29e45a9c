"""The decorator that makes a Fabric task out of a library call.

Expected failures (`OpsError`) become one clear message on stderr and exit status 1, without a
traceback; Ctrl-C exits 130 quietly; anything else keeps its traceback (it is a bug).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

from fabric import Task, task
from invoke.exceptions import Exit

from dflash_ops.core.errors import OpsError

INVENTORY_HELP = "inventory file (default: $DFLASH_INVENTORY, else ./inventory.yaml)"

# The one-letter flags the tasks do take (invoke's automatic ones are off: see ops_task).
SHORT_FLAGS = {"yes": "y", "verbose": "v"}


class _OpsTask(Task):
    """A Fabric task whose parameters named in SHORT_FLAGS also answer to their letter."""

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict:
        opts = super().arg_opts(name, default, taken_names)
        short = SHORT_FLAGS.get(name)
        if short and short not in taken_names:
            opts["names"] = [*opts["names"], short]
        return opts


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
