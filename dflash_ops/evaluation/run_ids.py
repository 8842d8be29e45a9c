"""Run ids people can type: a short id to show, and any unique part of an id to find a run.

A run id is `<stamp>[-<training run>]-step<N>-<host>[-<tag>]-<hex>` (jobs.new_run_id): the
trailing random hex is its short id. Where two runs share it (or an id has none, as results
pulled from elsewhere may), the whole id is shown instead.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from dflash_ops.core.errors import OpsError

# jobs.new_run_id's shape: a UTC stamp first, the random hex last.
_RUN_ID = re.compile(r"^\d{8}-\d{6}-.+-([0-9a-f]{4})$")


class RunIdError(OpsError):
    """No run, or more than one, answers to what was typed."""


def short_ids(run_ids: Iterable[str]) -> dict[str, str]:
    """Each id's short form: its trailing hex where no other id of `run_ids` shares it."""
    ids = list(dict.fromkeys(run_ids))
    tails = {run_id: _tail(run_id) for run_id in ids}
    counts = Counter(tails.values())
    return {
        run_id: tail if tail and counts[tail] == 1 else run_id for run_id, tail in tails.items()
    }


def _tail(run_id: str) -> str | None:
    found = _RUN_ID.match(run_id)
    return found.group(1) if found else None


def match(run_ids: Iterable[str], typed: str, where: str = "") -> str:
    """The one id of `run_ids` that `typed` names: the id itself, else the only id holding
    `typed` anywhere (its short id, a step, a date…). `where` says where the ids were listed
    (for the message)."""
    ids = list(dict.fromkeys(run_ids))
    typed = typed.strip()
    if typed in ids:
        return typed
    found = [run_id for run_id in ids if typed and typed in run_id]
    if len(found) == 1:
        return found[0]
    place = f" {where}" if where else ""
    if not found:
        raise RunIdError(
            f"no run id{place} contains {typed!r}; `fab eval-status` lists the runs and their "
            "short ids"
        )
    shown = ", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
    raise RunIdError(f"{typed!r} is part of several run ids{place} ({shown}); give more of it")
