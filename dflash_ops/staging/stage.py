"""Stage a checkpoint: plan every hop (space, resume offset), move the bytes, verify, promote.

`stage` copies the trainer's file to each eval host (through the workstation's staging dir
first in two-hop mode). Each hop checks free space before writing, resumes a partial,
verifies the sha256 of both ends, and promotes the partial with its manifest only then.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from dflash_ops.core.errors import CheckpointError, InventoryError, TransferError
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.units import format_bytes
from dflash_ops.remote.connection import Host
from dflash_ops.remote.containers import environment_of
from dflash_ops.staging.catalog import (
    STABLE_AFTER_S,
    checkpoint_path,
    list_checkpoints,
    resolve_step,
)
from dflash_ops.staging.destination import (
    Destination,
    DestinationState,
    Identity,
    staged_path,
)
from dflash_ops.staging.disk import Margin, SpaceCheck, margin_of, space_check
from dflash_ops.staging.lock import DestinationLock
from dflash_ops.staging.relay import (
    LocalSide,
    ProgressCallback,
    RemoteSide,
    Side,
    digest_in,
    move,
    stderr_reason,
)
from dflash_ops.staging.sources import Pulled, Source, Via, plain_source, trainer_source


@dataclass
class HopPlan:
    source: str
    destination: Destination
    size: int
    already: bool
    offset: int
    space: SpaceCheck | None

    def describe(self) -> str:
        if self.already:
            return f"{self.source} → {self.destination}: already staged"
        resume = f", resume from {format_bytes(self.offset)}" if self.offset else ""
        space = f"\n    disk: {self.space.describe()}" if self.space else ""
        return (
            f"{self.source} → {self.destination}: "
            f"{format_bytes(self.size - self.offset)} to move{resume}{space}"
        )


@dataclass(frozen=True)
class StagedCheckpoint:
    host: str  # inventory host name, or 'workstation' for the two-hop copy
    path: str
    sha256: str
    size: int
    step: int
    moved: int  # bytes sent in this run (0: already staged)
    already: bool
    plan: tuple[HopPlan, ...] = ()  # the hops this copy took (or, dry run, would take)


@dataclass
class StageOptions:
    via: Via = "stream"
    two_hop: bool = False
    resume: bool = True
    verify: bool = False
    dry_run: bool = False
    margin: str | None = None
    on_progress: ProgressCallback | None = None
    report: Callable[[str], None] = print
    progress_factory: Callable[[str, int], ProgressCallback] | None = None


def stage(
    inventory: Inventory,
    step: int | None = None,
    to: list[str] | None = None,
    *,
    latest: bool = False,
    options: StageOptions | None = None,
) -> list[StagedCheckpoint]:
    """Stage the trainer's checkpoint at `step` on the eval hosts `to` (default: all).

    Returns one StagedCheckpoint per host (and one for the workstation in two-hop mode), with
    the staged path, its sha256 and size. Raises CheckpointError / TransferError /
    DiskSpaceError with what to do; an interrupted transfer leaves a resumable partial."""
    options = options or StageOptions()
    names = to or list(inventory.eval_hosts)
    for name in names:
        inventory.eval_host(name)  # unknown names fail before any connection
    margin = margin_of(inventory, options.margin)
    env = environment_of(inventory.trainer.container)
    if options.via == "pull" and env.pull_command("/", "/") is None:
        raise InventoryError(
            f"{inventory.path}: --pull needs a trainer container that can copy files out "
            f"(kind pct or docker); found {env.description}"
        )
    if latest or step is None:
        step = resolve_step(inventory, step, latest=True).step
    source = trainer_source(inventory, step, options.via)
    found = source.stat()
    if found is None:
        resolve_step(inventory, step, latest=False)  # raises with the available steps
        raise CheckpointError(f"{source.description}: not found")
    identity = Identity(
        inventory.trainer_name, checkpoint_path(inventory, step), found.size, found.mtime, step
    )
    results: list[StagedCheckpoint] = []
    if options.two_hop:
        local = Destination(LocalSide(), staged_path(inventory, LocalSide.name, step))
        copy = _deliver(inventory, source, identity, local, margin, options, None)
        results.append(copy)
        source = plain_source(LocalSide(), local.path, "staging")
        expected = copy.sha256
    else:
        expected = None
    destinations = [
        Destination(RemoteSide(Host(inventory, name)), staged_path(inventory, name, step))
        for name in names
    ]
    for destination in destinations:
        results.append(
            _deliver(inventory, source, identity, destination, margin, options, expected)
        )
    return results


def _deliver(
    inventory: Inventory,
    source: Source,
    identity: Identity,
    dest: Destination,
    margin: Margin,
    options: StageOptions,
    expected_sha: str | None,
) -> StagedCheckpoint:
    state = dest.state()
    if state.matches(identity):
        sha = state.manifest["sha256"]
        if options.verify:
            _verify_staged(source, dest, dest.path, sha)
        options.report(
            f"{dest}: already staged (sha256 {sha[:16]}…"
            f"{', verified again' if options.verify else ''})"
        )
        hop = HopPlan(source.description, dest, identity.size, True, 0, None)
        return StagedCheckpoint(
            dest.side.name, dest.path, sha, identity.size, identity.step, 0, True, (hop,)
        )
    hops = _plan_hops(inventory, source, identity, dest, state, margin, options)
    if options.dry_run:
        return StagedCheckpoint(
            dest.side.name, dest.path, "", identity.size, identity.step, 0, False, hops
        )
    for hop in hops:
        hop.space.require()
    if inventory.trainer.complete_marker or source.now - identity.mtime < STABLE_AFTER_S:
        _require_complete(inventory, identity)
    with DestinationLock(dest.side, dest.lock, dest.partial, options.report):
        state = dest.state()  # another run may have finished or grown the partial meanwhile
        if state.matches(identity):
            sha = state.manifest["sha256"]
            options.report(f"{dest}: already staged (by another run)")
            return StagedCheckpoint(
                dest.side.name, dest.path, sha, identity.size, identity.step, 0, True, hops
            )
        offset = _resume_offset(state, identity, options)
        if options.via == "pull" and source.label == "stream":
            with Pulled(inventory, identity) as pulled:
                sha, moved = _transfer(pulled, source, identity, dest, offset, options)
        else:
            origin = source if expected_sha is None else None
            sha, moved = _transfer(source, origin, identity, dest, offset, options)
        if expected_sha and sha != expected_sha:
            dest.remove_partial()
            raise TransferError(
                f"{dest}: sha256 {sha} differs from the staging copy's {expected_sha}; the "
                f"partial was removed. Rerun to transfer again."
            )
        dest.promote(
            {
                **asdict(identity),
                "sha256": sha,
                "staged_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "staged_via": source.description,
            }
        )
    options.report(f"{dest}: staged and verified (sha256 {sha[:16]}…, {format_bytes(moved)} moved)")
    return StagedCheckpoint(
        dest.side.name, dest.path, sha, identity.size, identity.step, moved, False, hops
    )


def _plan_hops(
    inventory: Inventory,
    source: Source,
    identity: Identity,
    dest: Destination,
    state: DestinationState,
    margin: Margin,
    options: StageOptions,
) -> tuple[HopPlan, ...]:
    """The writes this copy makes, each with its free-space check: the copy out of the
    container first when pulling, then the destination (from its resume offset)."""
    offset = _resume_offset(state, identity, options)
    space = space_check(
        dest.side.name,
        dest.directory,
        state.free,
        identity.size - offset,
        margin,
        f"step {identity.step}",
    )
    hops = [HopPlan(source.description, dest, identity.size, False, offset, space)]
    if options.via == "pull" and source.label == "stream":
        tmp_dir = inventory.trainer.tmp_dir
        pull_space = space_check(
            source.side.name,
            tmp_dir,
            source.side.free_bytes(tmp_dir),
            identity.size,
            margin,
            f"copy out of {environment_of(inventory.trainer.container).description}",
        )
        pull = HopPlan(
            source.description,
            Destination(source.side, tmp_dir),
            identity.size,
            False,
            0,
            pull_space,
        )
        hops.insert(0, pull)
    return tuple(hops)


def _resume_offset(state: DestinationState, identity: Identity, options: StageOptions) -> int:
    partial = state.partial_size
    if options.resume and partial is not None and partial <= identity.size:
        return partial
    return 0


def _require_complete(inventory: Inventory, identity: Identity) -> None:
    info = next((c for c in list_checkpoints(inventory) if c.step == identity.step), None)
    if info is not None and not info.complete:
        how = (
            f"its marker {inventory.trainer.complete_marker} is missing"
            if inventory.trainer.complete_marker
            else "its size is still changing"
        )
        raise CheckpointError(
            f"{inventory.trainer_name}: step {identity.step} at {identity.source_path} looks "
            f"incomplete ({how}): is it still being written? Wait for it and retry."
        )


def _transfer(
    source: Source,
    origin: Source | None,
    identity: Identity,
    dest: Destination,
    offset: int,
    options: StageOptions,
) -> tuple[str, int]:
    """Move the bytes, check the stream ended cleanly and the trainer's file (`origin`; None
    for the verified staging copy) did not change, and return the verified sha256 and the
    bytes moved. The partial is kept when the stream breaks."""
    fresh = offset == 0
    if fresh:
        source_command = source.side.stream_hashed(source.read(0), source.file)
    else:
        source_command = f"set -o pipefail; {source.read(offset)}"
    sink = dest.side.sink(dest.partial, append=not fresh, hashed=fresh)
    remaining = identity.size - offset
    callback = options.on_progress
    if options.progress_factory is not None:
        callback = _chain(options.progress_factory(str(dest), remaining), callback)
    moved = move(source.side.argv(source_command), dest.side.argv(sink), remaining, callback)
    kept = f"The partial {dest.partial} is kept: rerun to resume."
    if moved.dest_rc != 0:
        reason = stderr_reason(moved.dest_err)
        raise TransferError(
            f"{dest.side.name}: writing {dest.partial} failed after "
            f"{format_bytes(offset + moved.count)} of {format_bytes(identity.size)} "
            f"(exit {moved.dest_rc}: {reason}). "
            + ("Free space there, then rerun to resume." if "No space" in reason else kept)
        )
    if moved.source_rc != 0 or moved.count < remaining:
        raise TransferError(
            f"{source.side.name}: the stream of {source.description} ended after "
            f"{format_bytes(moved.count)} of {format_bytes(remaining)} "
            f"(exit {moved.source_rc}: {stderr_reason(moved.source_err)}). {kept}"
        )
    now = origin.stat() if origin else None
    if origin and (now is None or (now.size, now.mtime) != (identity.size, identity.mtime)):
        dest.remove_partial()
        raise TransferError(
            f"{origin.description} changed during the transfer (size/mtime "
            f"{identity.size}/{identity.mtime} → {now.size if now else 'gone'}/"
            f"{now.mtime if now else '-'}); not promoted, partial removed. Wait until the "
            f"trainer has finished writing it, then rerun."
        )
    if moved.count != remaining:
        dest.remove_partial()
        raise TransferError(
            f"{source.description} sent {moved.count} bytes, expected {remaining}; not "
            f"promoted, partial removed. Rerun to stage again."
        )
    if fresh:
        source_sha, dest_sha = moved.source_digest, moved.dest_digest
    else:
        source_sha, dest_sha = _hash_both(source, dest.side, dest.partial)
    if not source_sha or source_sha != dest_sha:
        dest.remove_partial()
        raise TransferError(
            f"{dest}: verification failed: sha256 at the source {source_sha}, of what "
            f"{dest.side.name} holds {dest_sha}. The partial was corrupt and has been "
            f"removed; rerun to transfer from scratch."
        )
    return source_sha, moved.count


def _chain(first: ProgressCallback, second: ProgressCallback | None) -> ProgressCallback:
    if second is None:
        return first

    def both(state) -> None:
        first(state)
        second(state)

    return both


def _hash_both(source: Source, side: Side, path: str) -> tuple[str | None, str | None]:
    """Whole-file sha256 at both ends, in parallel (after a resume, or for --verify)."""

    def at_source() -> str | None:
        out = source.side.run(
            f"set -o pipefail; {source.read(0)} | {source.side.hash_stdin()}", check=False
        )
        return digest_in(out.stdout)

    def at_dest() -> str | None:
        out = side.run(f"{side.hash_stdin()} < {shlex.quote(path)}", check=False)
        return digest_in(out.stdout)

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(at_source), pool.submit(at_dest)
        return a.result(), b.result()


def _verify_staged(source: Source, dest: Destination, path: str, recorded: str) -> None:
    source_sha, dest_sha = _hash_both(source, dest.side, path)
    if not (source_sha == dest_sha == recorded):
        raise TransferError(
            f"{dest}: --verify failed: source sha256 {source_sha}, staged file {dest_sha}, "
            f"manifest {recorded}. Remove {dest.manifest} and rerun to stage again."
        )
