"""The decorator that makes a Fabric task out of a library call.

Flags that several tasks take alike are declared once, as a FlagGroup: each becomes one of
the task's parameters (with the group's help), and the task's body receives the group's
values together as one dict. The harness options are such groups, read from the harness's
option table (dflash_eval.contract.options: `harness_flags`), so a new harness option is one
table entry (plus its consumer in the harness): no task lists the options by hand.

Expected failures (`OpsError`) become one clear message on stderr and exit status 1, without a
traceback; Ctrl-C exits 130 quietly; anything else keeps its traceback (it is a bug).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dflash_eval.contract import options as table
from dflash_eval.contract.errors import HarnessError
from fabric import Task, task
from invoke.exceptions import Exit, ParseError
from invoke.parser import Argument

from dflash_ops.core.errors import OpsError
from dflash_ops.evaluation.harness_options import task_help

INVENTORY_HELP = "inventory file (default: $DFLASH_INVENTORY, else ./inventory.yaml)"


def _numbers() -> dict[str, table.Option]:
    """The numeric harness options the tasks pass on, by keyword, as the table has them when
    a task's flags are made."""
    return {o.name: o for o in table.OPTIONS if o.tasks and o.kind in ("int", "float")}


class _Flag(Argument):
    """A task's argument that names itself as typed (`--samples`) in invoke's parse errors,
    which otherwise show its repr: "Flag <_NumberArgument: samples [int]> needed value"."""

    def __repr__(self) -> str:
        name = max(self.names, key=len)
        return f"-{name}" if len(name) == 1 else f"--{name}"


class _NumberArgument(_Flag):
    """A harness option's flag that is parsed and range-checked by the harness's table as
    invoke reads it: a bad value is one line (ParseError), not int()'s traceback."""

    def __init__(self, option: table.Option, **kwargs) -> None:
        # invoke's help shows =INT for int and nothing for any other kind but str.
        super().__init__(kind=int if option.kind == "int" else str, **kwargs)
        self.option = option

    def set_value(self, value: object, cast: bool = True) -> None:
        try:
            parsed = table.parse(self.option, value) if cast else value
        except HarnessError as error:  # it names the flag
            raise ParseError(str(error)) from None
        super().set_value(parsed, cast=False)


# Fabric's and Invoke's own flags that change how commands run or where they connect. These
# tasks connect through the inventory and run nothing with `c.run`, so each of these would be
# silently ignored (`fab -R stage-checkpoint` once really copied a checkpoint): refuse them,
# saying what does that job here.
CORE_FLAG_ADVICE = {
    "hosts": "-H/--hosts: hosts come from the inventory (a task's --host picks one of them)",
    "dry": "-R/--dry: use the task's own --dry-run (stage-checkpoint, run-eval, prune)",
    "identity": "-i/--identity: set identity_file on the host in the inventory",
    "ssh_config": "-S/--ssh-config: set ssh_config at the top of the inventory",
    "connect_timeout": "-t/--connect-timeout: set connect_timeout on the host in the inventory",
    "command_timeout": "-T/--command-timeout: the tasks set their own timeouts",
    "password": "--prompt-for-login-password: use keys or an ssh agent",
    "passphrase": "--prompt-for-passphrase: load the key into an ssh agent",
    "echo": "-e/--echo: commands are not echoed by these tasks",
    "pty": "-p/--pty: these tasks need no terminal on the remote side",
    "warn": "-w/--warn-only: these tasks decide themselves what a failure means",
}


def ignored_core_flags(context: object) -> list[str]:
    """The keys of CORE_FLAG_ADVICE that the command line (or a Fabric config file) set."""
    from fabric import Connection

    config = context.config  # type: ignore[attr-defined]
    connect = config.get("connect_kwargs", {}) or {}
    found = {
        "hosts": isinstance(context, Connection),
        "dry": config.run.dry,
        "identity": connect.get("key_filename"),
        # -S is kept outside the config's data, on an attribute of Fabric's own.
        "ssh_config": getattr(config, "_runtime_ssh_path", None),
        "connect_timeout": connect.get("timeout"),
        "command_timeout": config.timeouts.get("command"),
        "password": connect.get("password"),
        "passphrase": connect.get("passphrase"),
        "echo": config.run.echo,
        "pty": config.run.pty,
        "warn": config.run.warn,
    }
    return [key for key, value in found.items() if value]


# The one-letter flags the tasks do take (invoke's automatic ones are off: see ops_task).
SHORT_FLAGS = {"yes": "y", "verbose": "v"}


class _OpsTask(Task):
    """A Fabric task whose harness-option flags take the harness's kinds, and whose
    parameters named in SHORT_FLAGS also answer to their letter."""

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict:
        opts = super().arg_opts(name, default, taken_names)
        short = SHORT_FLAGS.get(name)
        if short and short not in taken_names:
            opts["names"] = [*opts["names"], short]
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        numbers = _numbers()
        return [
            _NumberArgument(
                numbers[argument.name],
                names=argument.names,
                default=argument.default,
                help=argument.help,
                attr_name=argument.attr_name,
            )
            if argument.name in numbers
            else _Flag(
                names=argument.names,
                kind=argument.kind,
                default=argument.default,
                help=argument.help,
                positional=argument.positional,
                optional=argument.optional,
                incrementable=argument.incrementable,
                attr_name=argument.attr_name,
            )
            for argument in super().get_arguments(ignore_unknown_help)
        ]


@dataclass(frozen=True)
class FlagGroup:
    """Flags several tasks take alike: each name of `defaults` becomes a parameter of a task
    that takes the group (unless the task declares its own of that name), with `help`; the
    task's body receives their values as one dict, its parameter `into`."""

    into: str
    defaults: Mapping[str, object]
    help: Mapping[str, str]

    def names(self, own: Mapping[str, object]) -> list[str]:
        """The group's flags a task with these own parameters takes from it."""
        return [name for name in self.defaults if name not in own]


def harness_flags(task: str) -> FlagGroup:
    """The harness options the option table gives `task`, received as `harness_options`;
    unset (a switch off) means the harness's default, which only the table states."""
    options = table.for_task(task)
    unset = {option.name: False if option.kind == "switch" else None for option in options}
    return FlagGroup("harness_options", unset, task_help(task))


def _signature(body: Callable, taken: list[tuple[FlagGroup, list[str]]]) -> inspect.Signature:
    """The task's signature as invoke reads it: the body's own parameters (less the dicts its
    groups fill), then the flags it takes from each group."""
    signature = inspect.signature(body)
    into = {group.into for group, _ in taken}
    own = [p for name, p in signature.parameters.items() if name not in into]
    added = [
        inspect.Parameter(
            name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=group.defaults[name]
        )
        for group, names in taken
        for name in names
    ]
    return signature.replace(parameters=[*own, *added])


def ops_task(
    help: dict[str, str] | None = None, groups: tuple[FlagGroup, ...] = (), **task_options
) -> Callable:
    """`@task` with OpsError handling; an `inventory` parameter gets its standard help; each
    of `groups` adds its flags (module docstring). `help` has the last word."""

    def decorate(body: Callable) -> Callable:
        own = inspect.signature(body).parameters
        taken = [(group, group.names(own)) for group in groups]

        @functools.wraps(body)
        def run(*args, **kwargs):
            for group, names in taken:  # a flag not given (a call from code): unset
                kwargs[group.into] = {n: kwargs.pop(n, group.defaults[n]) for n in names}
            try:
                if args and (ignored := ignored_core_flags(args[0])):
                    raise OpsError(
                        "this task does not honour Fabric's own flags: "
                        + "; ".join(CORE_FLAG_ADVICE[key] for key in ignored)
                    )
                return body(*args, **kwargs)
            except OpsError as exc:
                from rich.markup import escape

                from dflash_ops.ui.console import errors

                errors.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
                raise Exit(code=1) from None
            except KeyboardInterrupt:
                raise Exit("interrupted", code=130) from None

        if groups:
            run.__signature__ = _signature(body, taken)  # type: ignore[attr-defined]
        helps = {
            **({"inventory": INVENTORY_HELP} if "inventory" in own else {}),
            **{name: text for group in groups for name, text in group.help.items()},
            **(help or {}),
        }
        # Long flags only: invoke's automatic one-letter flags (-h for --host…) confuse more
        # than they save.
        return task(help=helps, auto_shortflags=False, klass=_OpsTask, **task_options)(run)

    return decorate
