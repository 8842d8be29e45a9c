"""A run's options as one value (EvalOptions): the run flags, with the fields, types and
defaults the option table declares (contract/options.py), and what only `eval` takes.

Stdlib only, so that what takes a run's options (the command line, the dry run, the checks of
inputs.py) has them without loading torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from dflash_eval.contract import options as run_options

_FIELD_TYPES: dict[str, type] = {
    "int": int,
    "float": float,
    "text": str,
    "dtype": str,
    "path": Path,
    "switch": bool,
    "on-off": bool,
    "ints": list[int],
    "names": list[str],
}


def fields(command: str) -> list[tuple[str, object, dataclasses.Field]]:
    """`dataclasses.make_dataclass` fields for the stored options of a harness command."""
    made = []
    for option in run_options.for_command(command):
        if not option.stored:
            continue
        kind = _FIELD_TYPES[option.kind]
        if option.required:
            made.append((option.name, kind, dataclasses.field()))
        elif isinstance(option.default, list):
            factory = option.default.copy
            made.append((option.name, kind, dataclasses.field(default_factory=factory)))
        else:
            hint = kind if option.default is not None else kind | None
            made.append((option.name, hint, dataclasses.field(default=option.default)))
    return made


def options_class(name: str, command: str) -> type:
    """A keyword-only dataclass of the stored options of a harness command."""
    return dataclasses.make_dataclass(name, fields(command), kw_only=True)


# The run flags' fields, as dflash_eval.contract.options declares them (type and default, once).
RunOptions = options_class("RunOptions", "eval")


@dataclass(kw_only=True)
class EvalOptions(RunOptions):
    """A run's options: the run flags (RunOptions) and what only `eval` takes."""

    out: Path
    training_run: str | None = None  # recorded in the checkpoint block when given
    features: Path | None = None  # a feature set: completions and hidden states read from it
