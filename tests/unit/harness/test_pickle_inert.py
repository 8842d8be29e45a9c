"""The pickle policy admits by proof: every global `--safe-globals` can ever admit is tried
here, inside a real torch checkpoint read under the policy, with every hostile argument and
state a file can give it (code as text, shell commands, the other admitted globals as
arguments, attribute overrides through BUILD): nothing runs, and what it builds can never be
called. A name off the list is refused whatever the user names, with advice that never
suggests naming it; real malicious pickles (timeit.timeit, os.system, builtins.eval,
functools.partial, operator.attrgetter…) never run, only `--allow-unsafe-pickle` gets past.
Every case runs through both readers: torch's (the run) and the shape reader (the dry run),
whose own list is narrower still."""

from __future__ import annotations

import argparse
import copyreg
import datetime
import functools
import importlib
import operator
import os
import pathlib
import timeit

import pytest
import torch
from dflash_eval.contract.errors import HarnessError
from dflash_eval.drafter.pickle_policy import (
    INERT_GLOBALS,
    INERT_GROUPS,
    PicklePolicy,
    admitted_objects,
    expand_names,
)
from dflash_eval.drafter.shape_reader import SHAPES_READER
from dflash_eval.drafter.torch_reader import TORCH_READER

EVERY_GROUP = PicklePolicy(tuple(INERT_GROUPS))
READERS = pytest.mark.parametrize(
    "read", [TORCH_READER.read_pickle, SHAPES_READER.read_pickle], ids=["torch", "shapes"]
)
ADMITTED = admitted_objects(expand_names(tuple(INERT_GROUPS)))


def importable(name: str) -> bool:
    module, _, attribute = name.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), attribute)
    except ImportError:
        return False


class Calls:
    """Pickles as `func(*args)` (then BUILD with `state`, when given): the file a hostile
    trainer would write, built with the real pickler."""

    def __init__(self, func, args: tuple, state=None) -> None:
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)


class Builds:
    """Pickles as NEWOBJ of `cls` then BUILD with `state`: what the pickler writes for an
    instance (it checks the instance's class, which this one reports as `cls`)."""

    def __init__(self, cls: type, state) -> None:
        self.cls, self.state = cls, state

    @property  # type: ignore[misc]
    def __class__(self):
        return self.cls

    def __reduce__(self):
        return (copyreg.__newobj__, (self.cls,), self.state)


def hostile_arguments(marker: pathlib.Path) -> list[tuple]:
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    shell = f"touch {marker}"
    namespace = argparse.Namespace(run=code)
    return [
        (),
        (code,),
        (shell,),
        (code, code, code),
        (code, {"cmd": shell}),
        ({"__reduce__": code},),
        (1, code),
        (str(marker),),
        (namespace,),
        (argparse.Namespace, code),
        (pathlib.PosixPath, (0,), code),
    ]


def hostile_states(marker: pathlib.Path) -> list:
    code = f"__import__('os').system('touch {marker}')"
    overrides = {"__call__": code, "__reduce__": code, "__getattr__": code, "__class__": code}
    return [overrides, (overrides, overrides), (None, {"__call__": code}), code, (code,)]


def load(tmp_path: pathlib.Path, payload, read) -> object | None:
    """The payload as a checkpoint's extra, read under every inert group; None if refused."""
    path = tmp_path / "c.pt"
    torch.save({"weights": torch.zeros(2), "payload": payload}, path)
    try:
        checkpoint, _ = read(path, EVERY_GROUP)
    except HarnessError:
        return None
    return checkpoint["payload"]


def test_every_inert_name_is_in_a_group_and_tried_below():
    """A name added to the list is tried by the tests below without further ado."""
    assert set(INERT_GROUPS) == {"argparse", "numpy", "pathlib", "datetime"}
    assert {name for names in INERT_GROUPS.values() for name in names} == INERT_GLOBALS
    tried = {name for _, name in ADMITTED}
    missing = {n for n in INERT_GLOBALS - tried if importable(n)}
    assert not missing  # every name that exists here resolves, so the tests reach it


@READERS
def test_what_the_groups_admit_loads_as_the_trainer_saved_it(tmp_path, read):
    """The hostile cases below are refused for what they carry, not for the global itself."""
    numpy = pytest.importorskip("numpy")
    values = {
        "args": argparse.Namespace(lr=3e-4, out=pathlib.Path("/runs/v4")),
        "rng": numpy.random.RandomState(0).get_state(),
        "loss": numpy.float64(1.25),
        "when": datetime.datetime(2026, 12, 1, 14, 0, tzinfo=datetime.timezone.utc),
        "day": datetime.date(2026, 12, 1),
        "took": datetime.timedelta(seconds=90),
        "path": pathlib.PurePosixPath("/a/b"),
    }
    loaded = load(tmp_path, values, read)
    assert loaded is not None and loaded["args"] == values["args"]
    assert all(loaded[k] == values[k] for k in ("loss", "when", "day", "took", "path"))
    assert (loaded["rng"][1] == values["rng"][1]).all()


def assert_inert(built: object | None, marker: pathlib.Path) -> None:
    assert not marker.exists()
    # What it built is data: calling it is impossible, or it is itself an admitted constructor.
    assert built is None or not callable(built) or any(built is obj for obj, _ in ADMITTED)


@READERS
@pytest.mark.parametrize("name", [name for _, name in ADMITTED])
def test_an_admitted_global_called_with_hostile_arguments_runs_nothing(tmp_path, name, read):
    target = dict((n, obj) for obj, n in ADMITTED)[name]
    marker = tmp_path / "pwned"
    for arguments in hostile_arguments(marker):
        assert_inert(load(tmp_path, Calls(target, arguments), read), marker)


@READERS
@pytest.mark.parametrize("name", [name for obj, name in ADMITTED if isinstance(obj, type)])
def test_an_admitted_class_built_with_hostile_state_runs_nothing(tmp_path, name, read):
    cls = dict((n, obj) for obj, n in ADMITTED)[name]
    marker = tmp_path / "pwned"
    for state in hostile_states(marker):
        built = load(tmp_path, Builds(cls, state), read)
        assert_inert(built, marker)
        if built is not None:
            assert type(built) is cls  # no override turned it into something else


def test_the_listed_names_resolve_to_constructors_of_data():
    """Classes, and numpy's two reconstructors (each builds an array or a scalar)."""
    for obj, name in ADMITTED:
        assert isinstance(obj, type) or name.endswith(("._reconstruct", ".scalar")), name


def partial_system(marker: pathlib.Path):
    return Calls(functools.partial(os.system, f"touch {marker}"), ())


MALICIOUS = {
    # The code as setup, which runs once (a statement would run a million times).
    "timeit.timeit": lambda m: Calls(timeit.timeit, ("pass", f"open({str(m)!r}, 'w')")),
    "posix.system": lambda m: Calls(os.system, (f"touch {m}",)),
    "builtins.eval": lambda m: Calls(eval, (f"open({str(m)!r}, 'w')",)),
    "builtins.exec": lambda m: Calls(exec, (f"open({str(m)!r}, 'w')",)),
    "functools.partial": partial_system,
    "operator.attrgetter": lambda m: Calls(operator.attrgetter("system"), (os,)),
    "pathlib.Path.touch": lambda m: Calls(pathlib.Path.touch, (m,)),
    "importlib.import_module": lambda m: Calls(importlib.import_module, ("antigravity",)),
}


@READERS
@pytest.mark.parametrize("name", MALICIOUS)
def test_a_malicious_pickle_never_runs_and_its_global_cannot_be_named(tmp_path, name, read):
    marker = tmp_path / "pwned"
    extras = {"args": argparse.Namespace(block_size=4), "payload": MALICIOUS[name](marker)}
    path = tmp_path / "c.pt"
    if name == "operator.attrgetter":  # a module does not pickle: name the global alone
        extras["payload"] = operator.attrgetter("system")
    torch.save(extras, path)
    for policy in (PicklePolicy(), EVERY_GROUP, PicklePolicy(("argparse",))):
        with pytest.raises(HarnessError) as refused:
            read(path, policy)
        message = str(refused.value)
        assert "Refusing to load" in message and "--allow-unsafe-pickle" in message
        assert f"--safe-globals {name}" not in message and "naming them" not in message
        assert "no --safe-globals admits it" in message
    for named in (name, name.rpartition(".")[0], f"argparse,{name}"):
        with pytest.raises(HarnessError, match="not on the harness's list of inert globals"):
            read(path, PicklePolicy(tuple(named.split(","))))
    assert not marker.exists()


@READERS
def test_only_the_unsafe_flag_gets_past(tmp_path, read):
    marker = tmp_path / "pwned"
    path = tmp_path / "c.pt"
    torch.save({"payload": MALICIOUS["timeit.timeit"](marker)}, path)
    read(path, PicklePolicy((), allow_unsafe=True))
    assert marker.exists()  # the payload is real: the refusals above stopped a live one
