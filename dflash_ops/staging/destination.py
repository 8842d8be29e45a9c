"""Where a staged checkpoint lives, what it is a copy of, and how it is promoted.

Staged layout on an eval host (and in the workstation's `local.staging` in two-hop mode):

    {staging}/step_{N}/checkpoint.pt                 the verified file
    {staging}/step_{N}/checkpoint.pt.manifest.json   source host/path, size, mtime, sha256
    {staging}/step_{N}/checkpoint.pt.partial         an unfinished transfer (resumable)
    {staging}/step_{N}/.checkpoint.pt.lock           flock of the stage in progress

A staged file is "already staged" when its manifest names the same source path, size and
mtime as the trainer's file now, and the file has that size: no bytes move.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from dflash_ops.core.errors import InventoryError
from dflash_ops.core.inventory import Inventory
from dflash_ops.remote import probes
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import STAGED_NAME, EvalLayout
from dflash_ops.staging.catalog import CheckpointInfo
from dflash_ops.staging.relay import HASHER_PROBE, LocalSide, RemoteSide, Side


@dataclass(frozen=True)
class Identity:
    """What a staged copy is a copy of: the trainer's file as it was when read."""

    source_host: str
    source_path: str
    size: int
    mtime: int
    step: int


def staged_path(inventory: Inventory, host: str, step: int) -> str:
    if host == LocalSide.name:
        if inventory.local.staging is None:
            raise InventoryError(f"{inventory.path}: two-hop mode needs local.staging set")
        return f"{inventory.local.staging}/step_{step}/{STAGED_NAME}"
    _, entry = inventory.eval_host(host)
    return EvalLayout(entry).staged_checkpoint(step)


@dataclass
class DestinationState:
    manifest: dict | None
    final_size: int | None
    partial_size: int | None
    free: int  # bytes free where the file goes

    def matches(self, identity: Identity) -> bool:
        m = self.manifest or {}
        return (
            self.final_size == identity.size
            and m.get("size") == identity.size
            and m.get("mtime") == identity.mtime
            and m.get("source_path") == identity.source_path
            and m.get("source_host") == identity.source_host
            and isinstance(m.get("sha256"), str)
        )


def _json_dict(text: str) -> dict | None:
    """A manifest's content; a damaged or empty one counts as none (the copy is redone)."""
    try:
        value = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


class Destination:
    def __init__(self, side: Side, path: str) -> None:
        self.side, self.path = side, path
        self.partial = f"{path}.partial"
        self.manifest = f"{path}.manifest.json"
        directory, _, name = path.rpartition("/")
        self.directory = directory or "/"
        self.lock = f"{self.directory}/.{name}.lock"

    def __str__(self) -> str:
        return f"{self.side.name}:{self.path}"

    def state(self) -> DestinationState:
        """Manifest, both files, free space and the side's hash tool: one round trip."""
        probe = probes.together(
            manifest=probes.Probe(f"cat -- {shlex.quote(self.manifest)} 2>/dev/null", _json_dict),
            final=probes.file_stat(self.path),
            partial=probes.file_stat(self.partial),
            free=probes.free_bytes(self.directory),
            hasher=probes.Probe(HASHER_PROBE, str),
        )
        found = probe.parse(self.side.run(probe.command).stdout)
        self.side.set_hasher(found["hasher"])
        final, partial = found["final"], found["partial"]
        return DestinationState(
            found["manifest"],
            final.size if final else None,
            partial.size if partial else None,
            found["free"],
        )

    def promote(self, manifest: dict) -> None:
        """Rename the verified partial into place, then write the manifest beside it."""
        q = shlex.quote
        text = json.dumps(manifest, sort_keys=True)
        tmp = f"{self.manifest}.tmp"
        self.side.run(
            f"mv -f -- {q(self.partial)} {q(self.path)} && "
            f"printf '%s\\n' {q(text)} > {q(tmp)} && sync -- {q(tmp)} && "
            f"mv -f -- {q(tmp)} {q(self.manifest)} && sync -- {q(self.directory)}"
        )

    def remove_partial(self) -> None:
        self.side.run(f"rm -f -- {shlex.quote(self.partial)}")


def staged_status(inventory: Inventory, host: str, infos: list[CheckpointInfo]) -> dict[int, str]:
    """Per step: 'staged' (manifest matches the trainer's file), 'stale' (an older copy),
    'partial N%' or '' (one small command per step)."""
    side = RemoteSide(Host(inventory, host))
    statuses: dict[int, str] = {}
    for info in infos:
        dest = Destination(side, staged_path(inventory, host, info.step))
        identity = Identity(inventory.trainer_name, info.path, info.size, info.mtime, info.step)
        state = dest.state()
        if state.matches(identity):
            statuses[info.step] = "staged"
        elif state.final_size is not None:
            statuses[info.step] = "stale"
        elif state.partial_size is not None and info.size:
            statuses[info.step] = f"partial {state.partial_size * 100 // info.size}%"
        else:
            statuses[info.step] = ""
    return statuses
