"""Where the bytes of a checkpoint come from: a command that streams a file from an offset.

The trainer's files are read in their training environment (streamed out of the container,
read through the container's host-side rootfs, or first copied out of the container into a
private temporary directory); the two-hop copy is read from the workstation's staging dir.
`TrainerFiles` maps a path of the training environment to the commands that reach it for one
`--via`, and describes a checkpoint — a file, or a directory with every file in it — in one
round trip.
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
from dflash_ops.remote.priority import low_priority
from dflash_ops.staging.catalog import list_directory_command, parse_listing
from dflash_ops.staging.manifest import Member
from dflash_ops.staging.relay_commands import source_command, stderr_reason
from dflash_ops.staging.sides import RemoteSide, Side

Via = Literal["stream", "pull", "rootfs"]


@dataclass
class Source:
    side: Side
    description: str  # for messages: where the bytes come from
    read: Callable[[int], str]  # offset → command writing the file's bytes from there on
    stat_command: str  # prints 'size mtime kind' or 'missing'
    label: str = ""
    file: str | None = None  # the path, when it is a plain file this side's shell can open
    gentle: bool = False  # the trainer's disk: read at low priority (remote.priority)

    def stat(self) -> probes.FileStat | None:
        return probes.parse_file_stat(self.side.run(self.stat_command).stdout)

    def command(self, offset: int, *, hashed: bool) -> str:
        """The bytes from `offset` (hashed in-stream when `hashed`), then the file's stat."""
        path = self.file if offset == 0 else None
        command = source_command(self.read(offset), self.stat_command, hashed=hashed, path=path)
        return self.gently(command, announce=True)

    def gently(self, command: str, *, announce: bool = False) -> str:
        """`command` (a bash command reading this file) at low priority, if this is gentle."""
        if not self.gentle:
            return command
        return low_priority(command, shell="bash", announce=self.side.name if announce else None)


def plain_source(side: Side, path: str, label: str, *, gentle: bool = False) -> Source:
    q = shlex.quote(path)
    return Source(
        side,
        f"{side.name}:{path}",
        lambda offset: f"tail -c +{offset + 1} -- {q}" if offset else f"cat -- {q}",
        probes.file_stat_command(q),
        label,
        path,
        gentle,
    )


@dataclass(frozen=True)
class Described:
    """A checkpoint as the trainer sees it now (one round trip)."""

    now: int  # the trainer's clock
    stat: probes.FileStat | None  # None: it does not exist
    members: tuple[Member, ...]  # a directory's files (empty for a file)
    marker: bool | None  # the completeness marker exists (None: the inventory names none)

    @property
    def is_directory(self) -> bool:
        return self.stat is not None and self.stat.kind == "directory"

    @property
    def size(self) -> int:
        return sum(m.size for m in self.members) if self.is_directory else self.stat.size

    @property
    def mtime(self) -> int:
        if self.is_directory:
            return max((m.mtime for m in self.members), default=self.stat.mtime)
        return self.stat.mtime


class TrainerFiles:
    """The trainer's files as one `--via` reaches them: through the container (stream, pull)
    or through its host-side rootfs."""

    def __init__(self, inventory: Inventory, via: Via) -> None:
        self.inventory, self.via = inventory, via
        self.side = RemoteSide(Host(inventory, inventory.trainer_name))
        self.env = environment_of(inventory.trainer.container)
        self.rootfs: str | None = None
        if via == "rootfs":
            self.rootfs = self.env.host_rootfs()
            if self.rootfs is None:
                raise InventoryError(
                    f"{inventory.path}: --via rootfs needs the trainer's container to name its "
                    f"host-side rootfs (container.rootfs for pct, or kind: rootfs); found "
                    f"{self.env.description}"
                )

    @property
    def description(self) -> str:
        return f"rootfs {self.rootfs}" if self.rootfs else self.env.description

    @property
    def gentle(self) -> bool:
        """Whether the reads run at low priority (inventory transfer.low_priority)."""
        return self.inventory.transfer.low_priority

    def host_path(self, path: str) -> str:
        """How a command given to `wrap` spells the training environment's `path`."""
        if self.rootfs:
            return f"{self.rootfs.rstrip('/')}/{path.lstrip('/')}"
        return self.env.host_path(path)

    def wrap(self, command: str) -> str:
        """A trainer-host command running `command` where the files are."""
        return command if self.rootfs else self.env.wrap(command)

    def source(self, path: str) -> Source:
        """The file at `path` (in the training environment)."""
        if self.rootfs:
            return plain_source(self.side, self.host_path(path), "rootfs", gentle=self.gentle)
        env = self.env
        return Source(
            self.side,
            f"{self.side.name}:{path} ({env.description})",
            lambda offset: env.stream_command(path, offset, gentle=self.gentle),
            env.run_command(probes.file_stat_command("{}"), path),
            "stream",
            gentle=self.gentle,
        )

    def describe(self, path: str, marker: str | None) -> Described:
        """The checkpoint at `path` — stat, a directory's files, the marker — and the clock."""
        q = shlex.quote(self.host_path(path))
        named = {
            "now": probes.Probe("date +%s", int),
            "stat": probes.Probe(probes.file_stat_command(q), probes.parse_file_stat),
            "files": probes.Probe(
                f"if [ -d {q} ]; then {list_directory_command(q)}; fi 2>/dev/null", str.splitlines
            ),
        }
        if marker is not None:
            quoted_marker = shlex.quote(self.host_path(marker))
            named["marker"] = probes.Probe(
                f"test -e {quoted_marker} && echo yes || echo no", lambda out: "yes" in out
            )
        probe = probes.together(**named)
        result = self.side.run(self.wrap(probe.command), check=False)
        if not result.ok:
            raise TransferError(
                f"{self.side.name}: cannot look at {path} in {self.description}: "
                f"{stderr_reason(result.stderr)}.{self.side.host.root_hint()}"
            )
        found = probe.parse(result.stdout)
        where = f"{self.side.name}:{path}"
        stat = found["stat"]
        members = parse_listing(found["files"], where) if stat and stat.kind == "directory" else ()
        return Described(found["now"], stat, members, found.get("marker"))


class Pulled:
    """Copy a file out of the container (`pct pull`, `docker cp`) into a fresh private
    directory under the trainer's tmp_dir, and remove that directory afterwards.

    A fresh `mktemp -d` directory (mode 0700) per pull: a fixed file name in a shared tmp_dir
    could be a symlink planted by another user, which the copy (as root) would follow."""

    def __init__(self, inventory: Inventory, path: str) -> None:
        self.path = path  # in the training environment
        self.side = RemoteSide(Host(inventory, inventory.trainer_name))
        self.env = environment_of(inventory.trainer.container)
        self.tmp_dir = inventory.trainer.tmp_dir
        self.gentle = inventory.transfer.low_priority
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
        copy = f"{self.directory}/{self.path.rpartition('/')[2]}"
        pull = self.env.pull_command(self.path, copy)
        if self.gentle:
            pull = low_priority(pull, shell="bash")
        result = self.side.run(pull, check=False)
        if not result.ok:
            self.__exit__()
            raise TransferError(
                f"{self.side.name}: copying {self.path} out of {self.env.description} to "
                f"{copy} failed: {stderr_reason(result.stderr)}; nothing was staged."
            )
        return plain_source(self.side, copy, "pulled", gentle=self.gentle)

    def __exit__(self, *exc) -> None:
        if self.directory:
            self.side.run(f"rm -rf -- {shlex.quote(self.directory)}", check=False)
            self.directory = None
