"""Where the bytes of a checkpoint come from: a command that streams them from an offset.

The trainer's file is read in its training environment (streamed out of the container, read
through the container's host-side rootfs, or first copied out of the container into a
private temporary directory); the two-hop copy is read from the workstation's staging dir.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from dflash_ops.core.errors import InventoryError, TransferError
from dflash_ops.core.inventory import Inventory
from dflash_ops.remote import probes
from dflash_ops.remote.connection import Host
from dflash_ops.remote.containers import environment_of
from dflash_ops.remote.layout import STAGED_NAME
from dflash_ops.staging.catalog import checkpoint_path
from dflash_ops.staging.destination import Identity
from dflash_ops.staging.relay import HASHER_PROBE, RemoteSide, Side, stderr_reason

Via = Literal["stream", "pull", "rootfs"]


@dataclass
class Source:
    side: Side
    description: str  # for messages: where the bytes come from
    read: Callable[[int], str]  # offset → command writing the file's bytes from there on
    stat_command: str
    label: str = ""
    file: str | None = None  # the path, when it is a plain file this side's shell can open
    now: int = 0  # the side's clock at the last stat

    def stat(self) -> probes.FileStat | None:
        """Size/mtime (and, in the same round trip, the side's clock and hash tool)."""
        probe = probes.together(
            hasher=probes.Probe(HASHER_PROBE, str),
            now=probes.Probe("date +%s", int),
            stat=probes.Probe(self.stat_command, probes.parse_file_stat),
        )
        found = probe.parse(self.side.run(probe.command).stdout)
        self.side.set_hasher(found["hasher"])
        self.now = found["now"]
        return found["stat"]


def plain_source(side: Side, path: str, label: str) -> Source:
    q = shlex.quote(path)
    return Source(
        side,
        f"{side.name}:{path}",
        lambda offset: f"tail -c +{offset + 1} -- {q}" if offset else f"cat -- {q}",
        probes.file_stat_command(q),
        label,
        path,
    )


def trainer_source(inventory: Inventory, step: int, via: Via) -> Source:
    trainer = inventory.trainer
    side = RemoteSide(Host(inventory, inventory.trainer_name))
    path = checkpoint_path(inventory, step)
    env = environment_of(trainer.container)
    if via == "rootfs":
        rootfs = env.host_rootfs()
        if rootfs is None:
            raise InventoryError(
                f"{inventory.path}: --via rootfs needs the trainer's container to name its "
                f"host-side rootfs (container.rootfs for pct, or kind: rootfs); found "
                f"{env.description}"
            )
        return plain_source(side, f"{rootfs.rstrip('/')}/{path.lstrip('/')}", "rootfs")
    return Source(
        side,
        f"{side.name}:{path} ({env.description})",
        lambda offset: env.stream_command(path, offset),
        env.run_command(probes.file_stat_command("{}"), path),
        "stream",
    )


class Pulled:
    """Copy the checkpoint out of the container (`pct pull`, `docker cp`) into a fresh private
    directory under the trainer's tmp_dir, and remove that directory afterwards.

    A fresh `mktemp -d` directory (mode 0700) per pull: a fixed file name in a shared tmp_dir
    could be a symlink planted by another user, which the copy (as root) would follow."""

    def __init__(self, inventory: Inventory, identity: Identity) -> None:
        self.identity = identity
        self.side = RemoteSide(Host(inventory, inventory.trainer_name))
        self.env = environment_of(inventory.trainer.container)
        self.tmp_dir = inventory.trainer.tmp_dir
        self.directory: str | None = None

    def __enter__(self) -> Source:
        made = self.side.run(
            f"mkdir -p -- {shlex.quote(self.tmp_dir)} && umask 077 && "
            f"mktemp -d -p {shlex.quote(self.tmp_dir)} dflash-pull.XXXXXXXX",
            check=False,
        )
        if not made.ok:
            raise TransferError(
                f"{self.side.name}: cannot make a private directory in {self.tmp_dir} for the "
                f"copy out of {self.env.description}: {stderr_reason(made.stderr)}. Check "
                f"`tmp_dir` in the inventory."
            )
        self.directory = made.stdout.strip()
        path = f"{self.directory}/{STAGED_NAME}"
        command = self.env.pull_command(self.identity.source_path, path)
        result = self.side.run(command, check=False)
        if not result.ok:
            self.__exit__()
            raise TransferError(
                f"{self.side.name}: copying {self.identity.source_path} out of "
                f"{self.env.description} to {path} failed: {stderr_reason(result.stderr)}; "
                f"nothing was staged."
            )
        return plain_source(self.side, path, "pulled")

    def __exit__(self, *exc) -> None:
        if self.directory:
            self.side.run(f"rm -rf -- {shlex.quote(self.directory)}", check=False)
            self.directory = None
