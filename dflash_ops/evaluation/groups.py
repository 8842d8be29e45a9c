"""Comparability groups: runs whose comparability keys are equal, compared among themselves.

The key is one function of a results file (dflash_eval.contract.reading.comparability_key): every
rule about what must match lives there, and its short name (`reading.key_id`, 'k3f9a1b2c') is
what names a group wherever runs leave this tool (exports, JSON, W&B, the report): it stays
the same however many runs are added. The groups' numbers are display order only, largest
first (ties: the group holding the most recently started run first), so `--group 1`, the
default, is the one most runs belong to; one odd run (`--num-prompts 4` once) makes a group
of its own instead of making the others incomparable. `--group` takes either: the number,
or the key's name (or an unambiguous start of it) to keep whatever the other groups do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from dflash_eval.contract.reading import (
    KEY_ID_PREFIX,
    canonical,
    comparability_key,
    key_id,
)
from dflash_eval.contract.schema import Results

from dflash_ops.core.arguments import MAX_COUNT, parse_count
from dflash_ops.core.errors import OpsError, ResultsError

Row = TypeVar("Row")


@dataclass
class RunGroup(Generic[Row]):
    number: int  # display order only: 1 = the largest now
    rows: list[Row]
    key: dict[str, Any]
    differs: list[str] = field(default_factory=list)  # key names unlike the compared group's

    @property
    def id(self) -> str:
        """The key's stable short name (reading.key_id)."""
        return key_id(self.key)


def key_fields(results: Results) -> dict[str, Any]:
    """A results file's comparability key as it leaves this tool (W&B, the watch's webhook):
    its short name, and the settings it names as JSON values."""
    key = comparability_key(results)
    return {"comparability_key": key_id(key), "comparability": json.loads(canonical(key))}


def group_runs(
    rows: Sequence[Row], key: Callable[[Row], dict[str, Any]], started: Callable[[Row], float]
) -> list[RunGroup[Row]]:
    """`rows` split by equal `key`, largest group first; each keeps the rows' order."""
    found: dict[str, RunGroup[Row]] = {}
    for row in rows:
        row_key = key(row)
        found.setdefault(key_id(row_key), RunGroup(0, [], row_key)).rows.append(row)
    ordered = sorted(
        found.values(),
        key=lambda group: (len(group.rows), max(started(row) for row in group.rows)),
        reverse=True,
    )
    for number, group in enumerate(ordered, start=1):
        group.number = number
    return ordered


def differing(key: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """The names whose values differ between two keys, in the key's order."""
    return [
        name
        for name, value in key.items()
        if canonical({0: value}) != canonical({0: baseline.get(name)})
    ]


def mark_against(groups: list[RunGroup[Row]], chosen: RunGroup[Row]) -> None:
    """Record in each group what sets it apart from `chosen`."""
    for group in groups:
        group.differs = differing(group.key, chosen.key)


def parse_group(typed: str | int | None) -> int | str | None:
    """`--group` as given: a group's number, or a key's name or start ('k3f9a1b2c', 'k3f9'),
    lowercased; None when not given."""
    if isinstance(typed, str) and typed.strip().lower().startswith(KEY_ID_PREFIX):
        return typed.strip().lower()
    if isinstance(typed, str) and not typed.strip().isdigit():
        raise OpsError(
            f"--group {typed!r}: expected a group's number (1 = the largest; compare lists "
            f"them) or its comparability key ({KEY_ID_PREFIX}3f9a1b2c, or its first digits)"
        )
    return parse_count("--group", typed, minimum=1, maximum=MAX_COUNT)


def pick_group(found: list[RunGroup[Row]], group: int | str) -> RunGroup[Row]:
    """The group numbered `group`, or the one whose key's name starts with `group`; a
    number out of range, or a key no group (or more than one) has, is one line listing
    what there is."""
    if isinstance(group, int):
        if not 1 <= group <= len(found):
            raise ResultsError(
                f"--group {group}: the selected runs form {len(found)} comparability "
                f"group(s); pass 1 to {len(found)} (compare lists them)"
            )
        return found[group - 1]
    matching = [other for other in found if other.id.startswith(group)]
    if len(matching) == 1:
        return matching[0]
    listed = ", ".join(f"{other.id} ({len(other.rows)} run(s))" for other in matching or found)
    if matching:
        raise ResultsError(f"--group {group}: {len(matching)} keys start so ({listed}); type more")
    raise ResultsError(
        f"--group {group}: no comparability key of the selected runs starts so; their keys: "
        f"{listed}"
    )
