"""How the training environment on the trainer is reached: one class per container kind.

Each kind is both the inventory section that describes it (`container: {kind: pct, id: 200}`)
and the plug-in that knows how to run a command inside it, name a path from the host, ask
whether it runs, and copy a file out. The host itself (no container) is the base class.
Adding a kind (LXD, podman, …) is one subclass here, listed in `CONTAINER_KINDS`.
"""

from __future__ import annotations

import operator
import shlex
from functools import reduce
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from dflash_ops.core.strict import Strict
from dflash_ops.remote.priority import low_priority
from dflash_ops.remote.probes import Probe


class HostItself(Strict):
    """No container: the trainer's files and commands are the host's own."""

    kind: Literal["host"] = "host"
    tool: ClassVar[str | None] = None  # the host-side command this kind needs (check-hosts)
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


class PctContainer(HostItself):
    """A Proxmox LXC container: commands run with `pct exec ID --`, files copy with `pct pull`."""

    kind: Literal["pct"]
    id: int
    rootfs: str | None = None  # host-side path of its filesystem, if reading it directly is wanted
    tool: ClassVar[str | None] = "pct"
    # lxc-attach forks from the caller, so priorities are inherited; set again inside all the
    # same, as the reader's own, so they hold whatever pct does in between.
    own_priority: ClassVar[bool] = True

    @property
    def description(self) -> str:
        return f"pct container {self.id}"

    def wrap(self, command: str) -> str:
        return f"pct exec {self.id} -- sh -c {shlex.quote(command)}"

    def status(self) -> Probe[bool] | None:
        return Probe(f"pct status {self.id}", _running)

    def host_rootfs(self) -> str | None:
        return self.rootfs

    def pull_command(self, in_container: str, host_path: str) -> str | None:
        return f"pct pull {self.id} {shlex.quote(in_container)} {shlex.quote(host_path)}"


class RootfsContainer(HostItself):
    """A container read through the host-side path of its root filesystem."""

    kind: Literal["rootfs"]
    path: str

    @property
    def description(self) -> str:
        return f"container rootfs {self.path}"

    def host_path(self, in_container: str) -> str:
        return f"{self.path.rstrip('/')}/{in_container.lstrip('/')}"

    def host_rootfs(self) -> str | None:
        return self.path


class DockerContainer(HostItself):
    kind: Literal["docker"]
    name: str
    tool: ClassVar[str | None] = "docker"
    own_priority: ClassVar[bool] = True

    @property
    def description(self) -> str:
        return f"docker container {self.name}"

    def wrap(self, command: str) -> str:
        return f"docker exec {shlex.quote(self.name)} sh -c {shlex.quote(command)}"

    def status(self) -> Probe[bool] | None:
        state = f"docker inspect -f '{{{{.State.Status}}}}' {shlex.quote(self.name)}"
        return Probe(state, _running)

    def pull_command(self, in_container: str, host_path: str) -> str | None:
        return f"docker cp {shlex.quote(f'{self.name}:{in_container}')} {shlex.quote(host_path)}"


CONTAINER_KINDS: tuple[type[HostItself], ...] = (PctContainer, RootfsContainer, DockerContainer)
# The inventory's `container:` section: whichever kind its `kind` key names.
Container = Annotated[reduce(operator.or_, CONTAINER_KINDS), Field(discriminator="kind")]
HOST_ITSELF = HostItself()


def environment_of(container: HostItself | None) -> HostItself:
    """The trainer's training environment: its container, else the host itself."""
    return container or HOST_ITSELF
