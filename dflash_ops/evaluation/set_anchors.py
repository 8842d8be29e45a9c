"""The workstation's own record of every feature set it made or relayed: the sha256 of the
set's `feature-set.json`, the anchor a pulled run's set is checked against.

A run reading a set checks each file against the set's `feature-set.json`
(remote/dflash_eval/reference/feature_files.py), so a set altered on the eval host together
with its `feature-set.json` passes there. The workstation's record is out of that host's
reach, as the staging manifest's sha256 is for a checkpoint: `extract-features` records the
sha256 when it computes a set (or first finds one) on the features host, and the host each
relay sends it to. The harness records the sha256 of the `feature-set.json` it read
(`features.set_sha256`); a pulled run whose sha256 is none the workstation recorded for that
set is flagged not comparable (results.compare), the message naming the set, the host, both
sha256s and the fix. A set the workstation has no record of (made before records were kept,
or from another workstation) flags nothing: there is nothing to check against.

On disk, one file per set, written whole (core/files.py):

    <local.results>/feature-sets/<set-id>.json
        {"set": ID, "sha256": [every feature-set.json sha256 made under this id, oldest first],
         "hosts": {HOST: the sha256 of the copy it was given (its features host: as made)}}
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dflash_eval.contract.schema import Results
from pydantic import Field

from dflash_ops.core.errors import HostError
from dflash_ops.core.files import write_atomic
from dflash_ops.core.records import Record, RecordError, read_json_file, validate
from dflash_ops.core.text import inert

ANCHORS_DIR = "feature-sets"  # under local.results, beside the pulled runs
FLAG = "feature set changed"  # what compare's `comparable` column says of a flagged run
WHY = {
    FLAG: "the feature-set.json the run read is not one the workstation recorded when it made "
    "or relayed the set"
}
SHORT = 12  # hex digits of a sha256 in messages
_SET_ID = re.compile(r"[A-Za-z0-9_.-]+-[0-9a-f]{12}")  # features/spec.set_id's shape


class SetAnchor(Record):
    set: str
    sha256: list[str] = Field(min_length=1)
    hosts: dict[str, str] = Field(default_factory=dict)


def anchor_file(results_root: Path, set_id: str) -> Path | None:
    """Where the record of `set_id` is kept (None: not a set id the tool makes, so none is:
    a name read from a host never becomes a path outside the directory)."""
    if not _SET_ID.fullmatch(set_id):
        return None
    return results_root / ANCHORS_DIR / f"{set_id}.json"


def read_anchor(results_root: Path, set_id: str) -> SetAnchor | None:
    """The record of `set_id` (None: none kept); RecordError when it is damaged."""
    path = anchor_file(results_root, set_id)
    if path is None or not path.exists():
        return None
    return validate(read_json_file(path), str(path), SetAnchor)


def _write(results_root: Path, set_id: str, anchor: SetAnchor) -> None:
    path = anchor_file(results_root, set_id)
    assert path is not None, set_id  # ids come from spec.set_id here
    write_atomic(path, json.dumps(anchor.model_dump(), indent=1) + "\n")


def record_made(
    results_root: Path, set_id: str, host: str, path: str, sha256: str, *, computed: bool
) -> None:
    """Record the set as it stands on its features host: computed now (a new make of this id:
    its sha256 joins the earlier ones), or found there. A found set whose sha256 is none the
    workstation recorded changed after it was made, and is refused before it is relayed."""
    anchor = read_anchor(results_root, set_id)
    if anchor is not None and not computed and sha256 not in anchor.sha256:
        raise HostError(
            host,
            f"feature set {set_id} at {path}: its feature-set.json has sha256 "
            f"{sha256[:SHORT]}…, not the {anchor.sha256[-1][:SHORT]}… the workstation "
            f"recorded when it was made: the set changed on {host} since, and is not relayed. "
            "Remove that directory there and run this extract-features again to compute the "
            "set afresh",
        )
    earlier = [] if anchor is None else [sha for sha in anchor.sha256 if sha != sha256]
    hosts = {} if anchor is None else anchor.hosts
    made = SetAnchor(set=set_id, sha256=[*earlier, sha256], hosts={**hosts, host: sha256})
    _write(results_root, set_id, made)


def record_relayed(results_root: Path, set_id: str, host: str, sha256: str) -> None:
    """Record that `host` holds the set whose feature-set.json hashes to `sha256`. Only a
    sha256 made under this id is recorded: a copy found already there whose manifest names
    another one is no copy of the set the workstation knows (its runs get flagged)."""
    anchor = read_anchor(results_root, set_id)
    if anchor is not None and sha256 in anchor.sha256:
        hosts = {**anchor.hosts, host: sha256}
        _write(results_root, set_id, anchor.model_copy(update={"hosts": hosts}))


def anchor_problem(anchor: SetAnchor | None, host: str, found: str | None) -> str | None:
    """Why a run on `host` that read a feature-set.json hashing to `found` cannot be trusted
    against the workstation's `anchor` of its set (None: it can, or there is nothing to check:
    no anchor, or results from a harness that recorded no sha256)."""
    if anchor is None or found is None or found in anchor.sha256:
        return None
    expected = anchor.hosts.get(host, anchor.sha256[-1])
    when = "relayed it there" if host in anchor.hosts else "made it"
    host = inert(host)
    return (
        f"feature set {anchor.set} on {host}: the run read a feature-set.json with sha256 "
        f"{inert(found[:SHORT])}…, but the workstation recorded {expected[:SHORT]}… when it "
        f"{when}: the set changed on {host} after it was relayed, and these numbers are not "
        f"comparable. Re-relay it: fab extract-features --to {host} --verify (with the set's "
        "inputs), then run again"
    )


def flag_of(results_root: Path, results: Results, host: str | None) -> str | None:
    """The problem of a pulled run's feature set (anchor_problem), if it read one."""
    features = results.get("features") or {}
    set_id = features.get("set")
    if set_id is None:
        return None
    try:
        anchor = read_anchor(results_root, set_id)
    except RecordError as exc:
        return f"feature set {set_id}: cannot be checked ({exc}); move that file aside"
    return anchor_problem(anchor, host or "?", features.get("set_sha256"))
