"""The harness options the fab tasks pass through, under the harness's own names.

The harness declares each option once (dflash_eval.contract.options: flag, kind, default, help,
check, and the fab tasks that take it); here a task's values are checked against that table,
so a bad value fails before anything is staged or launched, and turned into the harness argv.
Options that run-eval manages itself (--checkpoint, --target, --out, --step, --cache-dir,
--prompts, --reference-drafter, --sglang-url, --drafter-config, --drafter-profile) name no
task in the table and are not taken here.
"""

from __future__ import annotations

from collections.abc import Mapping

from dflash_eval.contract import options as table
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.option_rules import check_together

from dflash_ops.core.errors import OpsError

PASSED = {
    option.name: option for option in table.OPTIONS if option.tasks
}  # what any task passes on


def task_help(task: str) -> dict[str, str]:
    """The fab help of the harness options that `task` takes (the harness's own help)."""
    return {option.name: table.help_text(option) for option in table.for_task(task)}


def checked(values: Mapping[str, object]) -> dict[str, object]:
    """Option values (text from the command line, or typed), each parsed and checked as the
    harness would, the rules between them included (a bad one fails naming its flag); unset
    ones are left out."""
    unknown = set(values) - set(PASSED)
    if unknown:
        raise OpsError(f"not harness options: {', '.join(sorted(unknown))}")
    found = {}
    for name, value in values.items():
        option = PASSED[name]
        try:
            parsed = table.parse(option, value)
        except HarnessError as error:  # it names the flag
            raise OpsError(str(error)) from None
        if parsed is not None and not (option.kind == "switch" and not parsed):
            found[name] = parsed
    try:
        check_together(found)
    except HarnessError as error:
        raise OpsError(str(error)) from None
    return found


def harness_args(values: Mapping[str, object]) -> list[str]:
    """The harness argv for option values (unset ones keep the harness's default)."""
    args: list[str] = []
    for name, value in checked(values).items():
        option = PASSED[name]
        args += (
            [option.flag]
            if option.kind == "switch"
            else [option.flag, table.as_text(option, value)]
        )
    return args
