"""One payload to one destination: read its state, plan the hop (space, resume offsets),
move what is missing under the destination's lock, verify, promote with the manifest.

The types a stage returns and takes live here too (StagedCheckpoint, HopPlan, StageOptions),
with the context one stage shares between its deliveries (a side per host, the trainer's
description, the head start of the first transfer: stage.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dflash_ops.core.errors import CheckpointError
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.units import format_bytes
from dflash_ops.remote.connection import Host
from dflash_ops.staging import catalog
from dflash_ops.staging.catalog import list_checkpoints
from dflash_ops.staging.destination import Destination, DestinationState, staged_path
from dflash_ops.staging.disk import Margin, SpaceCheck, margin_of, space_check
from dflash_ops.staging.manifest import Kind, Member, file_manifest, set_manifest
from dflash_ops.staging.payload import Payload
from dflash_ops.staging.relay import Pipe, ProgressCallback
from dflash_ops.staging.relay_commands import gated
from dflash_ops.staging.sides import LocalSide, RemoteSide, Side
from dflash_ops.staging.sources import Described, Via
from dflash_ops.staging.transfer import checked, copy_members, verify_staged


@dataclass
class HopPlan:
    source: str
    destination: Destination
    size: int
    already: bool
    offset: int  # bytes already there (resumed)
    space: SpaceCheck | None
    files: int = 1  # files still to move

    def describe(self) -> str:
        if self.already:
            return f"{self.source} → {self.destination}: already staged"
        resume = f", resume from {format_bytes(self.offset)}" if self.offset else ""
        files = f" in {self.files} files" if self.files > 1 else ""
        space = f"\n    disk: {self.space.describe()}" if self.space else ""
        return (
            f"{self.source} → {self.destination}: "
            f"{format_bytes(self.size - self.offset)} to move{files}{resume}{space}"
        )


@dataclass(frozen=True)
class StagedCheckpoint:
    host: str  # inventory host name, or 'workstation' for the two-hop copy
    path: str  # the staged file, or directory (directory and extracted kinds)
    sha256: str  # of the file; of a set: over its files' sha256 (manifest.set_digest)
    size: int  # bytes of the copy
    step: int
    moved: int  # bytes sent in this run (0: already staged)
    already: bool
    plan: tuple[HopPlan, ...] = ()  # the hops this copy took (or, dry run, would take)
    kind: Kind = "file"
    source_size: int = 0  # the trainer's checkpoint (more than `size` for extracted weights)
    files: tuple[dict, ...] = ()  # a set: every file's name, size, mtime, sha256


@dataclass
class StageOptions:
    via: Via = "stream"
    two_hop: bool = False
    resume: bool = True
    verify: bool = False
    dry_run: bool = False
    margin: str | None = None
    weights_only: bool = False
    on_progress: ProgressCallback | None = None
    report: Callable[[str], None] = print
    progress_factory: Callable[[str, int], ProgressCallback] | None = None


@dataclass
class HeadStart:
    """The first destination's transfer, started before the checkpoint is even described, on
    the guess that it is a single file (the usual layout), and that destination's state, read
    while the trainer is asked: taken by the first delivery when the guess holds."""

    dest: Destination
    pipe: Pipe | None
    state: DestinationState | None = None

    def take(
        self, dest: Destination, payload: Payload
    ) -> tuple[Pipe | None, DestinationState | None]:
        if (dest.side.name, dest.path, dest.kind) != (
            self.dest.side.name,
            self.dest.path,
            self.dest.kind,
        ) or (payload.reader is None or self.state is None):
            return None, None
        pipe, state, self.pipe, self.state = self.pipe, self.state, None, None
        return pipe, state

    def cancel(self) -> None:
        if self.pipe is not None:
            self.pipe.cancel()
            self.pipe = None


@dataclass
class StageContext:
    inventory: Inventory
    options: StageOptions
    margin: Margin
    found: Described | None = None
    head: HeadStart | None = None
    complete_checked: bool = field(default=False)
    sides: dict[str, Side] = field(default_factory=dict)

    def destination(self, host: str, step: int, kind: Kind) -> Destination:
        """Where `host` keeps this step's copy of `kind`. One side per host: every destination
        on a host shares its control connection (one SSH handshake per host, not one per use)."""
        if host not in self.sides:
            local = host == LocalSide.name
            self.sides[host] = LocalSide() if local else RemoteSide(Host(self.inventory, host))
        return Destination(self.sides[host], staged_path(self.inventory, host, step, kind), kind)


def deliver(
    inventory: Inventory, payload: Payload, dest: Destination, options: StageOptions
) -> StagedCheckpoint:
    """Copy a payload that is not a trainer checkpoint (a feature set directory on a features
    host) to `dest` with the same checks, resume and promotion as a checkpoint."""
    margin = margin_of(inventory, options.margin)
    context = StageContext(inventory, options, margin, complete_checked=True)
    return deliver_one(payload, dest, context)


def deliver_one(payload: Payload, dest: Destination, context: StageContext) -> StagedCheckpoint:
    early, state = context.head.take(dest, payload) if context.head else (None, None)
    if early is None:
        early = _start_early(payload, dest, context)
    try:
        return _deliver_started(payload, dest, context, early, state or dest.state())
    finally:
        if early is not None and early.gated:  # never used: stop it untouched
            early.cancel()


def _start_early(payload: Payload, dest: Destination, context: StageContext) -> Pipe | None:
    """The first file's transfer, gated, so its SSH handshakes overlap the control steps."""
    if context.options.dry_run or payload.pull is not None or not payload.members:
        return None
    first = payload.members[0]
    source = payload.source(first)
    return Pipe(
        source.side.argv(gated(source.command(0, hashed=True))),
        dest.side.argv(gated(dest.sink(dest.writes_to(first)))),
        gated=True,
        bwlimit=context.inventory.transfer.bwlimit,
    )


def _deliver_started(
    payload: Payload,
    dest: Destination,
    context: StageContext,
    early: Pipe | None,
    state: DestinationState,
) -> StagedCheckpoint:
    options, identity = context.options, payload.identity
    if dest.matches(state, identity, payload.members):
        return _already(payload, dest, state, options)
    if not payload.members:
        raise CheckpointError(
            f"{dest}: its copy of {identity.source_path} changed while the stage ran; rerun"
        )
    dest.require_ours(state)
    hops = _plan_hops(payload, dest, state, context)
    if options.dry_run:
        return _result(payload, dest, "", 0, already=False, plan=hops)
    for hop in hops:
        hop.space.require()
    _require_complete(payload, context)
    with dest.locked(options.report) as lock:
        state = dest.locked_state(lock)  # another run may have been here meanwhile
        if dest.matches(state, identity, payload.members):
            options.report(f"{dest}: already staged (by another run)")
            return _result(payload, dest, state.manifest["sha256"], 0, True, hops, state.manifest)
        dest.require_ours(state)
        todo = _todo(payload, dest, state, options.resume)
        if early is not None and (not todo or todo[0] != (payload.members[0], 0)):
            early.cancel()
            early = None
        records = _verified(payload, dest, state, todo)
        if dest.is_set:
            prepare = dest.prepare_command(payload.members, fresh=not options.resume)
            checked(lock.run(prepare), dest, "preparing the copy")
        progress = (options.on_progress, options.progress_factory)
        bwlimit = context.inventory.transfer.bwlimit
        moved = copy_members(payload, dest, todo, lock, early, progress, bwlimit)
        records += moved.records
        payload.require_unchanged()
        manifest = _manifest(payload, dest, records)
        checked(lock.run(dest.promote_command(manifest)), dest, "promoting the copy")
    gentle = moved.gentleness()
    options.report(
        f"{dest}: staged and verified (sha256 {manifest['sha256'][:16]}…, "
        f"{format_bytes(moved.count)} moved{'; ' + gentle if gentle else ''})"
    )
    return _result(payload, dest, manifest["sha256"], moved.count, False, hops, manifest)


def _result(
    payload: Payload,
    dest: Destination,
    sha256: str,
    moved: int,
    already: bool,
    plan: tuple[HopPlan, ...],
    manifest: dict | None = None,
) -> StagedCheckpoint:
    files = tuple((manifest or {}).get("files", ()))
    size = sum(f["size"] for f in files) if files else payload.size
    return StagedCheckpoint(
        dest.side.name,
        dest.path,
        sha256,
        size,
        payload.identity.step,
        moved,
        already,
        plan,
        dest.kind,
        payload.identity.size,
        files,
    )


def _already(
    payload: Payload, dest: Destination, state: DestinationState, options: StageOptions
) -> StagedCheckpoint:
    sha = state.manifest["sha256"]
    if options.verify:
        verify_staged(payload, dest, state.manifest)
    options.report(
        f"{dest}: already staged (sha256 {sha[:16]}…{', verified again' if options.verify else ''})"
    )
    hop = HopPlan(payload.description, dest, payload.identity.size, True, 0, None)
    return _result(payload, dest, sha, 0, True, (hop,), state.manifest)


def _todo(
    payload: Payload, dest: Destination, state: DestinationState, resume: bool
) -> list[tuple[Member, int]]:
    """The members still to move, each with the offset its transfer resumes from."""
    if not resume:
        return [(member, 0) for member in payload.members]
    offsets = [(member, dest.resume_offset(state, member)) for member in payload.members]
    return [(member, offset) for member, offset in offsets if offset is not None]


def _verified(payload: Payload, dest: Destination, state: DestinationState, todo) -> list[dict]:
    """The records of the members a resumed set already holds (verified earlier)."""
    pending = {member.name for member, _ in todo}
    latest = {r["name"]: r for r in state.records if "name" in r}
    return [latest[m.name] for m in payload.members if m.name not in pending]


def _plan_hops(
    payload: Payload, dest: Destination, state: DestinationState, context: StageContext
) -> tuple[HopPlan, ...]:
    """The writes this copy makes, each with its free-space check: the copy out of the
    container first when pulling, then the destination (from its resume offsets)."""
    todo = _todo(payload, dest, state, context.options.resume)
    to_write = sum(member.size - offset for member, offset in todo)
    space = space_check(
        dest.side.name,
        dest.directory,
        state.free,
        to_write,
        context.margin,
        payload.what or f"step {payload.identity.step}",
        payload.space_advice(dest.side.name) if payload.space_advice else "",
    )
    size = payload.size
    hops = [HopPlan(payload.description, dest, size, False, size - to_write, space, len(todo))]
    if payload.pull is not None and payload.reader is not None:
        trainer = payload.reader.side
        tmp_dir = context.inventory.trainer.tmp_dir
        largest = max((member.size for member, _ in todo), default=0)  # pulled one at a time
        pull_space = space_check(
            trainer.name,
            tmp_dir,
            trainer.free_bytes(tmp_dir),
            largest,
            context.margin,
            f"copy out of {payload.reader.env.description}",
        )
        pull_dest = Destination(trainer, tmp_dir)
        hops.insert(0, HopPlan(payload.description, pull_dest, largest, False, 0, pull_space))
    return tuple(hops)


def _require_complete(payload: Payload, context: StageContext) -> None:
    """Refuse a checkpoint the trainer may still be writing (once per stage)."""
    if context.complete_checked or payload.reader is None:
        return
    inventory, found, identity = context.inventory, context.found, payload.identity
    incomplete = None
    if found.marker is False:
        incomplete = f"its marker {inventory.trainer.complete_marker} is missing"
    elif found.marker is None and catalog.STABILITY.recent(found.now, identity.mtime):
        listed = list_checkpoints(inventory, payload.reader.side.host)
        info = next((c for c in listed if c.step == identity.step), None)
        if info is not None and not info.complete:
            incomplete = "its size is still changing"
    if incomplete:
        raise CheckpointError(
            f"{inventory.trainer_name}: step {identity.step} at {identity.source_path} looks "
            f"incomplete ({incomplete}): is it still being written? Wait for it and retry."
        )
    context.complete_checked = True


def _manifest(payload: Payload, dest: Destination, records: list[dict]) -> dict:
    via = payload.description
    if dest.kind == "file":
        return file_manifest(payload.identity, records[0]["sha256"], via)
    return set_manifest(payload.identity, dest.kind, records, via, payload.extra)
