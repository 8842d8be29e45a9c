"""Relay a feature set from the features host to eval hosts, through the workstation, with
staging's own machinery: the set directory is a payload of kind `directory`, so every file is
hashed at both ends, an interrupted relay resumes file by file, the copy is promoted with one
manifest (`<set-id>.manifest.json` beside it), and a host whose manifest already matches the
source is skipped. Before the first byte moves, staging's dry run plans every host's copy
and any host without room for it (plus the margin) is named (space.py).

`verify` hashes each relayed copy again against its manifest; a copy that no longer matches
(a corrupt file) is removed and sent again.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass

from dflash_ops.core.errors import CheckpointError, TransferError
from dflash_ops.core.inventory import Inventory
from dflash_ops.evaluation.set_anchors import record_relayed
from dflash_ops.features.extract import FeatureSet
from dflash_ops.features.space import eval_host_advice, require_room
from dflash_ops.features.spec import SET_RECORD
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.staging.delivery import StagedCheckpoint, StageOptions, deliver
from dflash_ops.staging.destination import Destination
from dflash_ops.staging.manifest import Identity, Member
from dflash_ops.staging.payload import Payload
from dflash_ops.staging.relay import ProgressCallback
from dflash_ops.staging.sides import RemoteSide
from dflash_ops.staging.sources import TrainerFiles
from dflash_ops.staging.transfer import verify_staged

SET_STEP = 0  # a set has no training step; its manifest's identity records 0


class HostDirectory(TrainerFiles):
    """Plain files on any inventory host, read the way staging reads the trainer's through a
    host-side rootfs (here `/`: no container in between)."""

    def __init__(self, inventory: Inventory, host: str) -> None:
        # Not TrainerFiles.__init__: that one reaches the trainer and its container.
        self.inventory, self.via, self.rootfs = inventory, "rootfs", "/"
        self.side = RemoteSide(Host(inventory, host))

    @property
    def description(self) -> str:
        return "feature set"


@dataclass
class RelayOptions:
    verify: bool = False
    report: Callable[[str], None] = print
    progress_factory: Callable[[str, int], ProgressCallback] | None = None


def relay_set(
    inventory: Inventory, source: FeatureSet, to: list[str], options: RelayOptions
) -> list[StagedCheckpoint]:
    """Copy the set to each eval host in `to` (skipping those that hold it verified)."""
    for name in to:
        inventory.eval_host(name)  # unknown names fail before any transfer
    payload = set_payload(inventory, source)
    stage_options = StageOptions(
        report=options.report, progress_factory=options.progress_factory, verify=False
    )
    destinations = {name: set_destination(inventory, name, source.set_id) for name in to}
    quiet = StageOptions(report=lambda _: None, dry_run=True)
    planned = [deliver(inventory, payload, dest, quiet) for dest in destinations.values()]
    require_room(planned)  # every short host named before a byte moves
    relayed = []
    for name, dest in destinations.items():
        if options.verify:
            _drop_if_corrupt(payload, dest, options.report)
        copy = deliver(inventory, payload, dest, stage_options)
        record = {file.get("name"): file.get("sha256") for file in copy.files}.get(SET_RECORD)
        if record is not None:  # the anchor of the runs on this host (set_anchors)
            record_relayed(inventory.local.results, source.set_id, name, record)
        relayed.append(copy)
    return relayed


def set_payload(inventory: Inventory, source: FeatureSet) -> Payload:
    reader = HostDirectory(inventory, source.host)
    found = reader.describe(source.path, None)
    if not found.is_directory or not found.members:
        raise CheckpointError(f"{source.host}:{source.path}: no feature set there to relay")
    identity = Identity(source.host, source.path, found.size, found.mtime, SET_STEP)
    return Payload(
        identity,
        "directory",
        found.members,
        source.path,
        reader,
        select=_all_files,
        extra={"feature_set": source.set_id},
        what=f"feature set {source.set_id}",
        space_advice=eval_host_advice,
    )


def set_destination(inventory: Inventory, host: str, identifier: str) -> Destination:
    _, entry = inventory.eval_host(host)
    side = RemoteSide(Host(inventory, host))
    return Destination(side, EvalLayout(entry).feature_set(identifier), "directory")


def _all_files(members: tuple[Member, ...]) -> tuple[Member, ...]:
    return members


def _drop_if_corrupt(payload: Payload, dest: Destination, report: Callable[[str], None]) -> None:
    """--verify: hash a relayed copy against its manifest; remove it when a file differs, so
    the delivery that follows sends the set again."""
    state = dest.state()
    if not dest.matches(state, payload.identity, payload.members):
        return
    try:
        verify_staged(payload, dest, state.manifest)
    except TransferError as problem:
        found = str(problem).split(": --verify failed: ", 1)[-1].split(". Remove")[0]
        report(f"[yellow]{dest}: {found}[/]: removing the copy and sending the set again")
        q = shlex.quote
        dest.side.run(f"rm -f -- {q(dest.manifest)} && rm -rf -- {q(dest.path)}")
        return
    report(f"{dest}: verified again ({len(payload.members)} files match the manifest)")
