"""How the training environment on the trainer is reached: one class per container kind.

Each kind's inventory section (`container: {kind: pct, id: 200}`) is a model in
dflash_ops.core.containers; its plug-in here knows how to run a command inside it, name a path
from the host, ask whether it runs, and copy a file out. The host itself (no container) is the
base class. Adding a kind (LXD, podman, …) is one section there and one subclass here, listed
in `KINDS`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import ClassVar

from dflash_ops.core.containers import DockerContainer, PctContainer, RootfsContainer
from dflash_ops.remote.priority import low_priority
from dflash_ops.remote.probes import Probe


@dataclass(frozen=True)
class HostItself:
    """No container: the trainer's files and commands are the host's own."""

    tool: ClassVar[str | None] = None  # the host-side command this kind needs (check-hosts)
    # Whether commands can run inside it (a rootfs is only read through its files).
    runs_commands: ClassVar[bool] = True
    # Whether the reader inside sets its own low priority: `wrap` may start it in a process
    # tree of its own (docker exec asks the daemon), out of reach of the host shell's nice.
    own_priority: ClassVar[bool] = False

    @property
    def description(self) -> str:
        return "the host itself"

    def host_path(self, in_container: str) -> str:
        """How a command run by `wrap` must spell the in-container path."""
        return in_container

    def wrap(self, command: str) -> str:
        """A host-shell command that runs `command` inside the environment."""
        return command

    def status(self) -> Probe[bool] | None:
        """Whether the container runs (None: nothing to ask)."""
        return None

    def host_rootfs(self) -> str | None:
        """The host-side directory of the container's filesystem, if known (--via rootfs)."""
        return None

    def pull_command(self, in_container: str, host_path: str) -> str | None:
        """A host command copying the file out to `host_path` (None: this kind cannot)."""
        return None

    def run_command(self, command_for: str, *paths: str) -> str:
        """`command_for` with `{}` placeholders filled by the quoted, mapped `paths`."""
        quoted = [shlex.quote(self.host_path(p)) for p in paths]
        return self.wrap(command_for.format(*quoted))

    def stream_command(self, in_container: str, offset: int = 0, *, gentle: bool = True) -> str:
        """Write the file's bytes from `offset` on to stdout. Inside a container the reader
        runs at low priority itself when `gentle` (see dflash_ops.remote.priority); on the
        host the caller lowers the whole command's."""
        path = shlex.quote(self.host_path(in_container))
        read = f"tail -c +{offset + 1} -- {path}" if offset else f"cat -- {path}"
        if self.own_priority and gentle:
            read = low_priority(read, announce=self.description)
        return self.wrap(read)


def _running(output: str) -> bool:
    """`pct status` ('status: running') or `docker inspect -f {{.State.Status}}` ('running')."""
    return output.strip().removeprefix("status:").strip() == "running"


@dataclass(frozen=True)
class InPct(HostItself):
    """A Proxmox LXC container: commands run with `pct exec ID --`, files copy with `pct pull`."""

    section: PctContainer
    tool: ClassVar[str | None] = "pct"
    # lxc-attach forks from the caller, so priorities are inherited; set again inside all the
    # same, as the reader's own, so they hold whatever pct does in between.
    own_priority: ClassVar[bool] = True

    @property
    def description(self) -> str:
        return f"pct container {self.section.id}"

    def wrap(self, command: str) -> str:
        return f"pct exec {self.section.id} -- sh -c {shlex.quote(command)}"

    def status(self) -> Probe[bool] | None:
        return Probe(f"pct status {self.section.id}", _running)

    def host_rootfs(self) -> str | None:
        return self.section.rootfs

    def pull_command(self, in_container: str, host_path: str) -> str | None:
        source, target = shlex.quote(in_container), shlex.quote(host_path)
        return f"pct pull {self.section.id} {source} {target}"


@dataclass(frozen=True)
class ThroughRootfs(HostItself):
    """A container read through the host-side path of its root filesystem."""

    section: RootfsContainer
    runs_commands: ClassVar[bool] = False

    @property
    def description(self) -> str:
        return f"container rootfs {self.section.path}"

    def host_path(self, in_container: str) -> str:
        return f"{self.section.path.rstrip('/')}/{in_container.lstrip('/')}"

    def host_rootfs(self) -> str | None:
        return self.section.path


@dataclass(frozen=True)
class InDocker(HostItself):
    section: DockerContainer
    tool: ClassVar[str | None] = "docker"
    own_priority: ClassVar[bool] = True

    @property
    def description(self) -> str:
        return f"docker container {self.section.name}"

    def wrap(self, command: str) -> str:
        return f"docker exec {shlex.quote(self.section.name)} sh -c {shlex.quote(command)}"

    def status(self) -> Probe[bool] | None:
        state = f"docker inspect -f '{{{{.State.Status}}}}' {shlex.quote(self.section.name)}"
        return Probe(state, _running)

    def pull_command(self, in_container: str, host_path: str) -> str | None:
        source = shlex.quote(f"{self.section.name}:{in_container}")
        return f"docker cp {source} {shlex.quote(host_path)}"


# Each inventory `kind` → its plug-in.
KINDS: dict[str, type] = {"pct": InPct, "rootfs": ThroughRootfs, "docker": InDocker}
HOST_ITSELF = HostItself()


def environment_of(
    container: PctContainer | RootfsContainer | DockerContainer | None,
) -> HostItself:
    """The trainer's training environment: its container's plug-in, else the host itself."""
    return KINDS[container.kind](container) if container else HOST_ITSELF
