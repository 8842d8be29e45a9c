"""Work on several hosts at once, a thread each (the work waits on SSH, not on the CPU). One
host's expected failure (OpsError) stops no other: each host finishes, then the failures are
raised together, each under its host's name."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
    (a bug) is raised with its traceback."""

    def run(name: str) -> T:
        result = work(name)
        if on_done is not None:
            on_done(name, result)
        return result

    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        futures = [(name, pool.submit(run, name)) for name in names]
    errors = {name: future.exception() for name, future in futures}
    for error in errors.values():
        if error is not None and not isinstance(error, OpsError):
            raise error
    failed = {name: error for name, error in errors.items() if error is not None}
    if len(failed) == 1:
        raise next(iter(failed.values()))
    if failed:
        raise HostError(
            ", ".join(failed),
            f"failed on {len(failed)} of {len(names)} hosts (the others finished): "
            + "; ".join(str(error) for error in failed.values()),
        )
    return [future.result() for _, future in futures]
