"""Move one staged copy's files: each file's bytes from its source to its partial, checked at
both ends (the stream ended cleanly, the trainer's file did not change, the sha256 of what
was read equals that of what was written, and, when known, the sha256 it had where it came
from), then finished under the lock at once, so a later interruption keeps it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dflash_ops.core.errors import TransferError
from dflash_ops.core.units import format_bytes
from dflash_ops.remote import probes
from dflash_ops.remote.connection import Result
from dflash_ops.staging.destination import Destination
from dflash_ops.staging.lock import DestinationLock
from dflash_ops.staging.manifest import Member
from dflash_ops.staging.pace import Paced
from dflash_ops.staging.payload import Payload
from dflash_ops.staging.relay import Moved, Pipe, ProgressCallback, RelayState
from dflash_ops.staging.relay_commands import digest_in, hash_file, hash_stdin, stderr_reason
from dflash_ops.staging.sides import Side
from dflash_ops.staging.sources import Source

ProgressFactory = Callable[[str, int], ProgressCallback]


def checked(result: Result, dest: Destination, what: str) -> Result:
    """A command run under the lock must have succeeded."""
    if result.exit_code != 0:
        raise TransferError(f"{dest}: {what} failed: {stderr_reason(result.stdout)}")
    return result


@dataclass
class Copied:
    count: int = 0
    records: list[dict] = field(default_factory=list)
    paced: list[Paced] = field(default_factory=list)  # each paced transfer's pacing
    priorities: list[str] = field(default_factory=list)  # what the readers ran at

    def add(self, moved: Moved) -> None:
        self.count += moved.count
        if moved.paced is not None:
            self.paced.append(moved.paced)
        self.priorities += [p for p in moved.priorities if p not in self.priorities]

    def gentleness(self) -> str:
        """How the copy spared the trainer, for its summary line ('' if it did not)."""
        parts = []
        if self.paced:
            sent = sum(p.sent for p in self.paced)
            seconds = sum(p.seconds for p in self.paced)
            average = format_bytes(sent / seconds if seconds > 0 else 0)
            parts.append(f"bwlimit {format_bytes(self.paced[0].limit)}/s (average {average}/s)")
        if self.priorities:
            parts.append("reader at " + "; ".join(self.priorities))
        return ", ".join(parts)


def copy_members(
    payload: Payload,
    dest: Destination,
    todo: list[tuple[Member, int]],
    lock: DestinationLock,
    early: Pipe | None,
    progress: tuple[ProgressCallback | None, ProgressFactory | None],
    bwlimit: int | None = None,
) -> Copied:
    """Move every member still to move, at most `bwlimit` bytes per second; each verified one
    is finished at once (a set's file gets its final name and resume record), so a later
    interruption keeps it."""
    total = sum(member.size - offset for member, offset in todo)
    progress = _SetProgress(*progress, str(dest), total)
    moved = Copied()
    for member, offset in todo:
        pipe, early = (early, None) if early is not None else (None, None)
        sha, one = _transfer(
            payload, member, dest, offset, lock, pipe, progress.callback(), bwlimit
        )
        moved.add(one)
        progress.advance(one.count)
        record = {**member.record(), "sha256": sha}
        moved.records.append(record)
        done = dest.member_done_command(member, record)
        if done is not None:
            checked(lock.run(done), dest, f"finishing {member.name}")
    return moved


class _SetProgress:
    """One progress total over every file of a copy (what the callbacks see)."""

    def __init__(
        self,
        on_progress: ProgressCallback | None,
        factory: ProgressFactory | None,
        label: str,
        total: int,
    ) -> None:
        self.base, self.total = 0, total
        self.callbacks = [c for c in (on_progress,) if c is not None]
        if factory is not None:
            self.callbacks.insert(0, factory(label, total))

    def callback(self) -> ProgressCallback | None:
        if not self.callbacks:
            return None

        def report(state: RelayState) -> None:
            overall = RelayState(
                self.base + state.done, self.total, state.source, state.destination
            )
            for callback in self.callbacks:
                callback(overall)

        return report

    def advance(self, count: int) -> None:
        self.base += count


def _transfer(
    payload: Payload,
    member: Member,
    dest: Destination,
    offset: int,
    lock: DestinationLock,
    pipe: Pipe | None,
    on_progress: ProgressCallback | None,
    bwlimit: int | None,
) -> tuple[str, Moved]:
    """Move one member's bytes, check the stream ended cleanly and the trainer's file did not
    change, and return the verified sha256 and what was moved. The partial is kept when the
    stream breaks, removed when what arrived cannot be right."""
    fresh = offset == 0
    partial = dest.writes_to(member)
    remaining = member.size - offset

    def discard(reason: str) -> TransferError:
        """What arrived cannot be right: remove it, and say why."""
        lock.run(dest.discard_command(member))
        return TransferError(reason)

    with payload.opened(member) as source:
        if pipe is None:
            pipe = Pipe(
                source.side.argv(source.command(offset, hashed=fresh)),
                dest.side.argv(dest.sink(partial, append=not fresh)),
                gated=False,
                bwlimit=bwlimit,
            )
        moved = pipe.run(remaining, on_progress)
        _require_clean_end(moved, source, dest, partial, offset, member.size)

        now = payload.after_read(member, moved.source_stat)
        if payload.reader is not None and (
            now is None or (now.size, now.mtime) != (member.size, member.mtime)
        ):
            raise discard(
                f"{source.description} changed during the transfer (size/mtime "
                f"{member.size}/{member.mtime} → {now.size if now else 'gone'}/"
                f"{now.mtime if now else '-'}); not promoted, partial removed. Wait until the "
                f"trainer has finished writing it, then rerun."
            )
        if moved.count != remaining:
            raise discard(
                f"{source.description} sent {moved.count} bytes, expected {remaining}; not "
                f"promoted, partial removed. Rerun to stage again."
            )
        if fresh:
            source_sha, dest_sha = moved.source_digest, moved.dest_digest
        else:
            source_sha, dest_sha = _hash_both(source, dest.side, partial)
    if not source_sha or source_sha != dest_sha:
        raise discard(
            f"{dest}: verification failed: sha256 at the source {source_sha}, of what "
            f"{dest.side.name} holds {dest_sha}. The partial was corrupt and has been "
            f"removed; rerun to transfer from scratch."
        )
    if member.sha256 and source_sha != member.sha256:
        raise discard(
            f"{dest}: sha256 {source_sha} of {member.name} differs from the {member.sha256} "
            f"it had where it came from; the partial was removed. Rerun to transfer again."
        )
    return source_sha, moved


def _require_clean_end(
    moved: Moved, source: Source, dest: Destination, partial: str, offset: int, size: int
) -> None:
    kept = f"The partial {partial} is kept: rerun to resume."
    if moved.dest_rc != 0:
        reason = stderr_reason(moved.dest_err)
        raise TransferError(
            f"{dest.side.name}: writing {partial} failed after "
            f"{format_bytes(offset + moved.count)} of {format_bytes(size)} "
            f"(exit {moved.dest_rc}: {reason}). {_after_write_failure(reason, dest, kept)}"
        )
    if moved.source_rc != 0 or moved.count < size - offset:
        raise TransferError(
            f"{source.side.name}: the stream of {source.description} ended after "
            f"{format_bytes(moved.count)} of {format_bytes(size - offset)} "
            f"(exit {moved.source_rc}: {stderr_reason(moved.source_err)}). {kept}"
        )


def _after_write_failure(reason: str, dest: Destination, kept: str) -> str:
    """What to do when the destination could not write: a rerun alone helps only when the
    cause was passing (a dropped link), not a full disk or a denied directory."""
    if "No space" in reason:
        return "Free space there, then rerun to resume."
    if "permission denied" in reason.lower():
        fix = dest.side.root_hint() or f" Check the owner and mode of {dest.directory} there."
        return f"A rerun cannot write there either.{fix}"
    return kept


def _hash_both(source: Source, side: Side, path: str) -> tuple[str | None, str | None]:
    """Whole-file sha256 at both ends, in parallel (after a resume, or for --verify)."""

    def at_source() -> str | None:
        command = f"set -o pipefail; {{ {source.read(0)}; }} | {{ {hash_stdin()}; }}"
        out = source.side.run(source.gently(command), check=False)
        return digest_in(out.stdout)

    def at_dest() -> str | None:
        return digest_in(side.run(hash_file(path), check=False).stdout)

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(at_source), pool.submit(at_dest)
        return a.result(), b.result()


def verify_staged(payload: Payload, dest: Destination, manifest: dict) -> None:
    """--verify: hash the staged copy again (and the source, for a file) against the manifest."""
    recorded = manifest["sha256"]
    if dest.kind == "file":
        source_sha, dest_sha = _hash_both(payload.source(payload.members[0]), dest.side, dest.path)
        if not (source_sha == dest_sha == recorded):
            raise TransferError(
                f"{dest}: --verify failed: source sha256 {source_sha}, staged file {dest_sha}, "
                f"manifest {recorded}. Remove {dest.manifest} and rerun to stage again."
            )
        return
    files = manifest.get("files", [])
    probe = probes.together(
        **{
            f"f{index}": probes.Probe(hash_file(f"{dest.path}/{record['name']}"), digest_in)
            for index, record in enumerate(files)
        }
    )
    found = probe.parse(dest.side.run(probe.command).stdout)
    wrong = [r["name"] for i, r in enumerate(files) if found[f"f{i}"] != r["sha256"]]
    if wrong:
        raise TransferError(
            f"{dest}: --verify failed: {', '.join(wrong)} no longer match(es) the manifest. "
            f"Remove {dest.manifest} and rerun to stage again."
        )
