"""Typed shapes of the run files the workstation reads back (see core/records.py): a run's
params.json (on the eval host) and its run.json (written by `fetch`). results.json has types
of its own, shared with the harness (dflash_eval.contract.schema, checked by schema_check).

Only what is read is typed; every other key passes through untouched. A file that does not
fit is a broken run, listed with the reason, never a crash of the listing around it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

from dflash_ops.core.records import Record
from dflash_ops.core.text import tag_problem


def _tag(tag: str) -> str:
    """A tag read back is held to the rule of `--tag` (core/text.py): one that breaks it was
    not given through this tool, and the run is listed broken, the tag shown escaped."""
    problem = tag_problem(tag)
    if problem is not None:
        raise ValueError(f"not a tag: {problem}")
    return tag


Tag = Annotated[str, AfterValidator(_tag)]


class RunParams(Record):
    """What was asked of a run (params.json), as far as listings read it."""

    step: int | None = None
    started: float | None = None  # epoch seconds
    tag: Tag | None = None
    training_run: str | None = None
    kind: str | None = None  # "features" for an extract-features run


class RunSummary(RunParams):
    """A fetched run's run.json (jobs.fetch)."""

    run_id: str | None = None
    host: str | None = None
    state: str | None = None
    exit_code: int | None = None
    finished: float | None = None
    problem: str | None = None
