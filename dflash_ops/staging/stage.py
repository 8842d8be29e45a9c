"""Stage a checkpoint: find it on the trainer, then deliver it to every destination
(delivery.py: plan the hop, move the bytes, verify, promote).

`stage` copies the trainer's checkpoint — a file, or a directory with every file in it — to
each eval host (through the workstation's staging dir first in two-hop mode); with
`weights_only`, only the drafter weights travel (extracted on the trainer, see strip.py).
Each hop checks free space before writing, resumes what an interrupted stage left (file by
file, and inside the file it was writing), verifies the sha256 of both ends of every file,
and promotes the copy with its manifest only then.

Few control round trips, overlapping the transfer's own SSH handshakes: the processes that
move the first file start gated while the destination's state is read (and are stopped
unused if nothing needs moving); every step after the lock — state again, a file done,
promote — runs through the lock's session, and the source reports the file's stat after its
last byte, in-band.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

from dflash_ops.core.errors import CheckpointError, InventoryError
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.units import format_bytes
from dflash_ops.remote.containers import environment_of
from dflash_ops.staging.catalog import checkpoint_path, resolve_step
from dflash_ops.staging.delivery import (
    HeadStart,
    StageContext,
    StagedCheckpoint,
    StageOptions,
    deliver_one,
)
from dflash_ops.staging.destination import Destination
from dflash_ops.staging.disk import margin_of
from dflash_ops.staging.manifest import Identity
from dflash_ops.staging.payload import (
    Payload,
    extracted_payload,
    from_copy,
    trainer_payload,
    weights_of_directory,
)
from dflash_ops.staging.relay import Pipe
from dflash_ops.staging.relay_commands import gated
from dflash_ops.staging.sides import LocalSide
from dflash_ops.staging.sources import Described, TrainerFiles
from dflash_ops.staging.strip import TrainerExtraction, Unavailable


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
    inventory = inventory.for_run(inventory.training_run)  # a trainer with runs only: its run
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
    reader = TrainerFiles(inventory, options.via)
    path = checkpoint_path(inventory, step)
    context = StageContext(inventory, options, margin)
    with contextlib.ExitStack() as cleanup:
        if not options.weights_only:
            first = LocalSide.name if options.two_hop else names[0]
            first_dest = context.destination(first, step, "file")
            context.head = _head_start(reader, path, first_dest, options)
            cleanup.callback(context.head.cancel)
        found = context.found = _describe(reader, path, _marker_path(inventory, step), context)
        if found.stat is None:
            resolve_step(inventory, step, latest=False)  # raises with the available steps
            raise CheckpointError(f"{reader.side.name}:{path} ({reader.description}): not found")
        identity = Identity(inventory.trainer_name, path, found.size, found.mtime, step)
        pull = inventory if options.via == "pull" else None
        payload = trainer_payload(identity, found, reader, pull)
        if context.head is not None and payload.kind != "file":
            context.head.cancel()  # the guess was wrong: a directory
        if options.weights_only:
            payload = _weights_only(payload, names, context, cleanup)
        return _deliver_all(payload, names, context)


def _head_start(
    reader: TrainerFiles, path: str, dest: Destination, options: StageOptions
) -> HeadStart:
    """Start the transfer to the first destination, gated, on the guess that `path` is a
    file (a dry run or a pull starts nothing)."""
    pipe = None
    if not options.dry_run and options.via != "pull":
        source = reader.source(path)
        pipe = Pipe(
            source.side.argv(gated(source.command(0, hashed=True))),
            dest.side.argv(gated(dest.sink(dest.partial))),
            gated=True,
            bwlimit=reader.inventory.transfer.bwlimit,
        )
    return HeadStart(dest, pipe)


def _describe(
    reader: TrainerFiles, path: str, marker: str | None, context: StageContext
) -> Described:
    """The trainer's checkpoint, and meanwhile the first destination's state (two hosts, two
    threads, while the head start's SSH handshakes run)."""
    head = context.head
    if head is None:
        return reader.describe(path, marker)
    with ThreadPoolExecutor(2) as pool:
        described = pool.submit(reader.describe, path, marker)
        state = pool.submit(head.dest.state)
        found = described.result()
        head.state = state.result()
    return found


def _marker_path(inventory: Inventory, step: int) -> str | None:
    marker = inventory.trainer.complete_marker
    if marker is None:
        return None
    return f"{inventory.trainer.checkpoints.rstrip('/')}/{marker.format(step=step)}"


def _weights_only(
    payload: Payload, names: list[str], context: StageContext, cleanup: contextlib.ExitStack
) -> Payload:
    """The drafter weights of the checkpoint: a directory's weight files, or what the trainer
    extracts from a training checkpoint (only when a destination still lacks them); the whole
    file when the trainer cannot extract."""
    if payload.kind == "directory":
        return weights_of_directory(payload)
    inventory, options, identity = context.inventory, context.options, payload.identity
    hosts = [LocalSide.name] if options.two_hop else names
    targets = [context.destination(host, identity.step, "extracted") for host in hosts]
    if all(dest.matches(dest.state(), identity, ()) for dest in targets):
        return extracted_payload(payload, None)
    if options.dry_run:
        options.report(
            "--weights-only (dry run): the trainer would extract the weights first; the plan "
            "shows the whole checkpoint, an upper bound of what moves"
        )
        return payload
    python = inventory.trainer.python
    outcome = cleanup.enter_context(TrainerExtraction(payload.reader, payload.root, python))
    if isinstance(outcome, Unavailable):
        options.report(
            f"--weights-only: {outcome.reason}. Copying the whole checkpoint instead; its "
            "optimizer state can be stripped on the eval host (`fab run-eval "
            "--strip-optimizer`)."
        )
        return payload
    saved = identity.size - outcome.size
    options.report(
        f"{payload.reader.side.name}: drafter weights extracted in "
        f"{payload.reader.env.description}: {format_bytes(outcome.size)} of "
        f"{format_bytes(identity.size)} ({format_bytes(saved)} less to move)"
    )
    return extracted_payload(payload, outcome)


def _deliver_all(
    payload: Payload, names: list[str], context: StageContext
) -> list[StagedCheckpoint]:
    step = payload.identity.step
    results: list[StagedCheckpoint] = []
    if context.options.two_hop:
        copy = deliver_one(
            payload, context.destination(LocalSide.name, step, payload.kind), context
        )
        results.append(copy)
        payload = from_copy(payload, copy.path, list(copy.files), copy.sha256)
    for name in names:
        dest = context.destination(name, step, payload.kind)
        results.append(deliver_one(payload, dest, context))
    return results
