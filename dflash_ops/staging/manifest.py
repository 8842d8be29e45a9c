"""What a staged copy is a copy of: the trainer's checkpoint as it was when read, the files
that were copied, and the manifest written beside the copy once every byte verified.

A checkpoint is one of three kinds of staged copy:

    file        the trainer's checkpoint file (checkpoint.pt), as it is
    directory   the trainer's checkpoint directory (Hugging Face config.json + safetensors,
                sharded or not), every file of it
    extracted   the drafter weights alone (--weights-only): safetensors + config written on
                the trainer from a training checkpoint, or a directory's weight files

A copy is "already staged" when its manifest names the same source (host, path, size, mtime)
and kind, and, for a directory, the same files (name, size, mtime).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Literal

Kind = Literal["file", "directory", "extracted"]


@dataclass(frozen=True)
class Member:
    """One file of a staged copy (`name` relative to the set; the file itself for `file`)."""

    name: str
    size: int
    mtime: int
    sha256: str | None = None  # known before the copy (extracted files, a verified copy)

    def record(self) -> dict:
        return {"name": self.name, "size": self.size, "mtime": self.mtime, "sha256": self.sha256}

    def same_file(self, record: dict) -> bool:
        """Whether a record of a verified copy is of this very file."""
        return (
            record.get("name") == self.name
            and record.get("size") == self.size
            and record.get("mtime") == self.mtime
            and isinstance(record.get("sha256"), str)
            and (self.sha256 is None or record["sha256"] == self.sha256)
        )


@dataclass(frozen=True)
class Identity:
    """The trainer's checkpoint as found: a file or a directory (size: total, mtime: newest)."""

    source_host: str
    source_path: str
    size: int
    mtime: int
    step: int

    def fields(self) -> dict:
        return {
            "source_host": self.source_host,
            "source_path": self.source_path,
            "size": self.size,
            "mtime": self.mtime,
            "step": self.step,
        }


def matches(manifest: dict | None, identity: Identity, kind: Kind, members: tuple) -> bool:
    """Whether `manifest` describes a complete copy of `identity` as `kind`. For a directory
    the files must be the same too; an extracted copy is known by its source alone (its files
    only exist once the extraction ran)."""
    m = manifest or {}
    if any(m.get(key) != value for key, value in identity.fields().items()):
        return False
    if not isinstance(m.get("sha256"), str):
        return False
    if kind == "file":
        return m.get("kind", "file") == "file"
    if m.get("kind") != kind:
        return False
    if kind == "extracted":
        return True
    listed = sorted((f.get("name"), f.get("size"), f.get("mtime")) for f in m.get("files", []))
    return listed == sorted((f.name, f.size, f.mtime) for f in members)


def set_digest(records: list[dict]) -> str:
    """One sha256 for a set of files: over 'sha256  name' lines, sorted by name."""
    lines = "".join(
        f"{r['sha256']}  {r['name']}\n" for r in sorted(records, key=lambda r: r["name"])
    )
    return hashlib.sha256(lines.encode()).hexdigest()


def file_manifest(identity: Identity, sha256: str, via: str) -> dict:
    return {**identity.fields(), "sha256": sha256, **_stamp(via)}


def set_manifest(
    identity: Identity, kind: Kind, records: list[dict], via: str, extra: dict | None = None
) -> dict:
    """A directory's or an extracted copy's manifest: the source, every file, one digest."""
    return {
        **identity.fields(),
        "kind": kind,
        "files": sorted(records, key=lambda r: r["name"]),
        "sha256": set_digest(records),
        **(extra or {}),
        **_stamp(via),
    }


def _stamp(via: str) -> dict:
    return {"staged_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "staged_via": via}
