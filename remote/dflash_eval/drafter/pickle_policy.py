"""Which pickled checkpoints the harness unpickles (dflash-spec.md §5), and how.

A training checkpoint is a torch pickle. Unpickling runs whatever functions the file names,
so a run reads it with `torch.load(weights_only=True)` (torch_reader.py): tensors,
containers and plain values only; a dry run reads it without torch, under a narrower list
still (shape_reader.py). Training scripts often store a little more beside the weights (an
`argparse.Namespace` of their arguments, a numpy RNG state); those are admitted only when
the user names them (`--safe-globals`), through torch's safe-globals mechanism (and the
shape reader's own list).

What can be named is a fixed list, chosen by proof and not by name: each entry is a
constructor of plain data that, whatever arguments a file gives it (text, numbers, tensors,
other entries), builds a value and calls nothing else (tests/unit/harness/test_pickle_inert.py
checks each one). Anything outside the list is refused, whatever the user names:
a global that is not on it may run code (`timeit.timeit` runs its text), and a checkpoint
that needs one is not plain data. Arbitrary unpickling stays possible only by the explicit
`--allow-unsafe-pickle`. Whichever was used is recorded.

Groups (`--safe-globals argparse,numpy`, or any of their dotted names):
- `argparse`: `argparse.Namespace` (an object with attributes, nothing else);
- `numpy`: numpy arrays, scalars and dtypes (what `numpy.random.get_state()` and numeric
  training metadata pickle to), under numpy 1.x's and 2.x's module paths;
- `pathlib`: paths (training arguments of `type=Path`); a path object touches no file;
- `datetime`: dates, times, durations and fixed-offset time zones (timestamps).
"""

from __future__ import annotations

import importlib
import pickletools
import re
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError

_NUMPY_DTYPE_CODES = "?bBhHiIlLqQefdgFDG"  # every numeric/bool dtype class BUILD may meet
_PICKLE_OPCODES = frozenset(opcode.code for opcode in pickletools.opcodes)
INERT_GROUPS: dict[str, tuple[str, ...]] = {
    "argparse": ("argparse.Namespace",),
    "numpy": (
        # numpy 1.x and 2.x pickle arrays and scalars under different module paths.
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray._reconstruct",
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray.scalar",
        "numpy.ndarray",
        "numpy.dtype",
    ),
    # Python 3.13 moved the classes to pathlib._local (their pickles name that).
    "pathlib": (
        "pathlib.Path",
        "pathlib.PosixPath",
        "pathlib.PurePosixPath",
        "pathlib._local.PosixPath",
        "pathlib._local.PurePosixPath",
    ),
    "datetime": ("datetime.datetime", "datetime.date", "datetime.timedelta", "datetime.timezone"),
}
# Every global the harness will ever admit, whatever a user or a profile names.
INERT_GLOBALS = frozenset(name for names in INERT_GROUPS.values() for name in names)

# How a damaged or foreign file fails deep inside an unpickler (a text file as checkpoint.pt
# ends in a KeyError of its memo): each means "not a checkpoint".
DAMAGED = (
    RuntimeError,
    EOFError,
    zipfile.BadZipFile,
    OSError,
    KeyError,
    AttributeError,
    ValueError,
    IndexError,
    TypeError,
    struct.error,
)

WEIGHTS_ONLY = "weights-only"
WITH_SAFE_GLOBALS = "weights-only + named safe globals"
FULL_UNPICKLE = "full unpickle (--allow-unsafe-pickle)"


@dataclass(frozen=True)
class PicklePolicy:
    """What a pickled checkpoint may contain beyond weights."""

    safe_globals: tuple[str, ...] = ()  # group names and/or dotted names, as the user gave them
    allow_unsafe: bool = False

    def describe(self) -> str:
        if self.allow_unsafe:
            return "unsafe allowed (--allow-unsafe-pickle)"
        return WITH_SAFE_GLOBALS if self.safe_globals else WEIGHTS_ONLY


@dataclass
class PickleRecord:
    """How one checkpoint was actually read, for the results."""

    policy: str
    safe_globals: list[str] = field(default_factory=list)  # dotted names admitted
    loaded_with: str = WEIGHTS_ONLY
    # Globals the file names beyond torch's own (zip format only; None: not inspectable).
    file_globals: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "safe_globals": self.safe_globals,
            "loaded_with": self.loaded_with,
            "file_globals": self.file_globals,
        }


def expand_names(names: tuple[str, ...] | list[str]) -> list[str]:
    """Group names replaced by their dotted names; a name off the inert list is refused."""
    expanded: list[str] = []
    for name in names:
        name = name.strip()
        if not name:
            continue
        if name in INERT_GROUPS:
            expanded += INERT_GROUPS[name]
        elif name in INERT_GLOBALS:
            expanded.append(name)
        else:
            raise HarnessError(
                f"--safe-globals: {name!r} is not on the harness's list of inert globals, "
                f"which is all it admits: the groups {', '.join(INERT_GROUPS)} and their "
                "names (pickle_policy.py). Anything else a pickle names may run code, so no "
                "option admits it: a checkpoint that needs it is not plain data. Load it only "
                "if you trust it completely (--allow-unsafe-pickle)."
            )
    return list(dict.fromkeys(expanded))


def start_record(policy: PicklePolicy) -> tuple[list[str], PickleRecord]:
    """The dotted names the policy admits, and the record of a read under it."""
    names = expand_names(policy.safe_globals)
    return names, PickleRecord(
        policy.describe(), names, WITH_SAFE_GLOBALS if names else WEIGHTS_ONLY
    )


def admitted_objects(names: list[str]) -> list[tuple[Any, str]]:
    """(object, the name the pickle uses) for each name that exists in this environment,
    plus numpy's dtype classes when numpy dtypes are admitted (BUILD needs them)."""
    resolved = []
    for name in names:
        module_name, _, attribute = name.rpartition(".")
        try:
            module = importlib.import_module(module_name)
            resolved.append((getattr(module, attribute), name))
        except (ImportError, AttributeError):
            continue  # e.g. numpy.core.* under numpy 3: a file naming it fails, loudly
    if "numpy.dtype" in names:
        import numpy

        for code in _NUMPY_DTYPE_CODES:
            cls = type(numpy.dtype(code))
            resolved.append((cls, f"{cls.__module__}.{cls.__qualname__}"))
    return resolved


def no_pickle_opcode(message: str) -> str | None:
    """Why a weights-only refusal is really a file that is no pickle at all: the byte it
    stopped at is no pickle opcode (a file of zero bytes stops at its first). A file that
    wants code names real opcodes (GLOBAL, REDUCE…): None for those."""
    match = re.search(r"Unsupported operand (\d+)", message)
    if match is None or chr(int(match.group(1))) in _PICKLE_OPCODES:
        return None
    return f"byte {int(match.group(1)):#04x} is not a pickle opcode: the file is no pickle"


def unreadable(path: Path, detail: str) -> str:
    return (
        f"Cannot read {path} ({path.stat().st_size} bytes{_zero_note(path)}) as a torch "
        f"checkpoint ({detail}). It is probably truncated or not a checkpoint; compare its "
        "size and hash with the source and re-stage it."
    )


def _zero_note(path: Path) -> str:
    """A file that starts with zero bytes only was allocated but never written (a copy
    that died after preallocating, a sparse file): worth saying, it points at the copy."""
    try:
        with path.open("rb") as file:
            head = file.read(4096)
    except OSError:
        return ""
    return ", beginning with zero bytes only" if head and not head.strip(b"\0") else ""


def refusal(path: Path, message: str, file_globals: list[str] | None) -> str:
    return (
        f"Refusing to load {path}: it is not a plain weights-only checkpoint "
        f"({unpickling_reason(message)}). Unpickling it would run code named inside the file, "
        f"which can do anything on this host. {_named_globals_advice(file_globals)}"
        "Loading everything (--allow-unsafe-pickle) is only for a file you trust completely; "
        "better, extract it once on a trusted machine (`python -m dflash_eval extract "
        "--allow-unsafe-pickle`)."
    )


def _named_globals_advice(file_globals: list[str] | None) -> str:
    """Which groups would admit this file, from the globals it names (zip only); a name off
    the inert list is said to be unadmittable, never suggested."""
    if not file_globals:
        return ""
    others = [name for name in file_globals if name not in INERT_GLOBALS]
    if others:
        return (
            f"It names {', '.join(others)}, not on the harness's list of inert globals: no "
            "--safe-globals admits it. "
        )
    groups = sorted(g for g, names in INERT_GROUPS.items() if set(names) & set(file_globals))
    return (
        "Everything it names is on the harness's list of inert globals: re-run with "
        f"--safe-globals {','.join(groups)}. "
    )


def unpickling_reason(message: str) -> str:
    """The one line of torch's long refusal that says what the file wanted."""
    markers = ("Unsupported global", "Unsupported operand", "Can only", "Trying to", "blocked")
    for line in message.splitlines():
        if any(marker in line for marker in markers):
            reason = line.strip().removeprefix("WeightsUnpickler error: ")
            return reason.split(". Please use")[0]
    return message.splitlines()[0] if message else "unknown unpickling error"
