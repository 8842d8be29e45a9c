"""What one stage copies — a file, a directory's files, or the extracted weights — and where
each file's bytes come from (the trainer, through one `--via`, or the workstation's verified
two-hop copy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from dflash_ops.core.errors import CheckpointError, TransferError
from dflash_ops.core.inventory import Inventory
from dflash_ops.remote.probes import FileStat
from dflash_ops.staging.manifest import Identity, Kind, Member
from dflash_ops.staging.sides import LocalSide
from dflash_ops.staging.sources import Described, Pulled, Source, TrainerFiles, plain_source
from dflash_ops.staging.strip import Extraction, weight_members


@dataclass(frozen=True)
class Payload:
    identity: Identity  # the trainer's checkpoint this is (part of) a copy of
    kind: Kind
    members: tuple[Member, ...]
    root: str  # the file itself (kind file), else the directory the members are in
    reader: TrainerFiles | None  # the trainer's files; None: the workstation's copy
    pull: Inventory | None = None  # copy each file out of the container first (--pull)
    # A directory: which of its files are copied (to list it again before promoting).
    select: Callable[[tuple[Member, ...]], tuple[Member, ...]] | None = None
    extra: dict = field(default_factory=dict)  # more manifest fields (an extraction's source)
    what: str = ""  # what messages call it (default: the step); a feature set names itself
    # What to free on a host too small for it, by host name (default: its staged checkpoints).
    space_advice: Callable[[str], str] | None = None

    @property
    def size(self) -> int:
        return sum(m.size for m in self.members)

    @property
    def description(self) -> str:
        side = self.reader.side.name if self.reader else LocalSide.name
        how = f" ({self.reader.description})" if self.reader else ""
        return f"{side}:{self.root}{how}"

    def path_of(self, member: Member) -> str:
        return self.root if self.kind == "file" else f"{self.root}/{member.name}"

    def source(self, member: Member) -> Source:
        if self.reader is None:
            return plain_source(LocalSide(), self.path_of(member), "staging")
        return self.reader.source(self.path_of(member))

    @contextlib.contextmanager
    def opened(self, member: Member) -> Iterator[Source]:
        """The member's source for one transfer (a pulled copy lives as long as this)."""
        if self.pull is None:
            yield self.source(member)
            return
        with Pulled(self.pull, self.path_of(member)) as pulled:
            yield pulled

    def after_read(self, member: Member, streamed_stat: FileStat | None) -> FileStat | None:
        """The trainer's file as it is after the transfer (a pull read a copy: ask again);
        None for the workstation's copy, which is checked by its sha256 instead."""
        if self.reader is None:
            return None
        return self.source(member).stat() if self.pull is not None else streamed_stat

    def require_unchanged(self) -> None:
        """A directory must still hold the same files (same sizes, same mtimes)."""
        if self.select is None or self.reader is None:
            return
        now = self.select(self.reader.describe(self.identity.source_path, None).members)
        if now != self.members:
            before, after = set(self.members), set(now)
            changed = sorted({m.name for m in before ^ after})
            raise TransferError(
                f"{self.description} changed during the transfer ({', '.join(changed[:5])} "
                f"{'were' if len(changed) > 1 else 'was'} added, removed or rewritten); not "
                "promoted. The files that verified are kept: rerun once the trainer has "
                "finished writing it."
            )


def trainer_payload(
    identity: Identity, found: Described, reader: TrainerFiles, pull: Inventory | None
) -> Payload:
    """The trainer's checkpoint as it is: a file, or every file of its directory."""
    if found.is_directory:
        return Payload(
            identity, "directory", found.members, identity.source_path, reader, pull, _every
        )
    member = Member(identity.source_path.rpartition("/")[2], identity.size, identity.mtime)
    return Payload(identity, "file", (member,), identity.source_path, reader, pull)


def weights_of_directory(payload: Payload) -> Payload:
    """A directory checkpoint's weight files only (optimizer and scheduler files stay)."""
    members = weight_members(payload.members)
    if not any(m.name.endswith(".safetensors") for m in members):
        raise CheckpointError(
            f"{payload.description} holds no *.safetensors weights (files: "
            f"{', '.join(m.name for m in payload.members[:10])}); stage it without "
            "--weights-only"
        )
    return replace(payload, kind="extracted", members=members, select=weight_members)


def extracted_payload(payload: Payload, extraction: Extraction | None) -> Payload:
    """The weights the trainer extracted (None: every destination has them already)."""
    if extraction is None:
        return replace(payload, kind="extracted", members=())
    return replace(
        payload,
        kind="extracted",
        members=extraction.members,
        root=extraction.directory,
        extra=extraction.manifest_fields(),
    )


def from_copy(payload: Payload, path: str, records: list[dict], sha256: str) -> Payload:
    """The same copy, read from the workstation's verified two-hop copy at `path`: every
    member must arrive with the sha256 it had there."""
    if payload.kind == "file":
        (member,) = payload.members
        members = (replace(member, sha256=sha256 or None),)
    elif records:
        members = tuple(Member(r["name"], r["size"], r["mtime"], r["sha256"]) for r in records)
    else:  # a dry run: nothing was copied to read back
        members = payload.members
    return replace(payload, members=members, root=path, reader=None, pull=None, select=None)


def _every(members: tuple[Member, ...]) -> tuple[Member, ...]:
    return members
