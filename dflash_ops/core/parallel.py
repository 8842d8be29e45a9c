"""Work on several hosts at once, a thread each (the work waits on SSH, not on the CPU). One
host's expected failure (OpsError) stops no other: each host finishes, then the failures are
raised together, each under its host's name."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from dflash_ops.core.errors import HostError, OpsError

T = TypeVar("T")


def on_each_host(
    names: list[str],
    work: Callable[[str], T],
    on_done: Callable[[str, T], None] | None = None,
) -> list[T]:
    """`work(name)` for every name in parallel, `on_done(name, result)` as each succeeds (from
    its thread); the results in `names`' order. Once all have ended: one host's OpsError is
    raised as it is, several as one HostError naming each host and its error; anything else
    (a bug) is raised with its traceback. Ctrl-C is raised at once: the threads are daemons,
    so the process does not wait for them to end."""
    results: dict[str, T] = {}
    errors: dict[str, BaseException] = {}

    def run(name: str) -> None:
        try:
            result = work(name)
            if on_done is not None:
                on_done(name, result)
            results[name] = result
        except BaseException as error:  # handed over to the caller's thread below
            errors[name] = error

    threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for error in errors.values():
        if not isinstance(error, OpsError):
            raise error
    if len(errors) == 1:
        raise next(iter(errors.values()))
    if errors:
        failed = [name for name in names if name in errors]
        raise HostError(
            ", ".join(failed),
            f"failed on {len(failed)} of {len(names)} hosts (the others finished): "
            + "; ".join(str(errors[name]) for name in failed),
        )
    return [results[name] for name in names]
