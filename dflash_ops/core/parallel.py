"""Work on several hosts at once, a thread each (the work waits on SSH, not on the CPU). One
host's expected failure (OpsError) stops no other: each host finishes, then the failures are
raised together, each under its host's name.

The main thread waits for them in slices (join_all, wait_for): Python runs a Ctrl-C's handler
in the main thread only, and when the OS hands the signal to another thread the main thread's
wait is not interrupted: an unsliced join would hold the Ctrl-C until every thread ended (a
watch went on to launch its next step).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from dflash_ops.core.errors import HostError, OpsError

T = TypeVar("T")
SLICE_S = 0.2  # the longest a Ctrl-C waits for the main thread to see it


def join_all(threads: Iterable[threading.Thread]) -> None:
    """Wait for every thread to end, waking each SLICE_S to take a Ctrl-C."""
    for thread in threads:
        while thread.is_alive():
            thread.join(SLICE_S)


def wait_for(event: threading.Event, seconds: float) -> bool:
    """`event.wait(seconds)`, waking each SLICE_S to take a Ctrl-C; True once it is set."""
    deadline = time.monotonic() + seconds
    while not event.is_set() and (left := deadline - time.monotonic()) > 0:
        event.wait(min(left, SLICE_S))
    return event.is_set()


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
    join_all(threads)
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
