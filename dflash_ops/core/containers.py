"""The trainer's `container:` section of the inventory: which kind of container the training
environment is, and what names it. One model per kind, told apart by its `kind` key; how a
kind is reached (commands inside it, its paths seen from the host, copying out) is its
plug-in in dflash_ops.remote.containers.
"""

from __future__ import annotations

import operator
from functools import reduce
from typing import Annotated, Literal

from pydantic import Field

from dflash_ops.core.strict import Strict


class PctContainer(Strict):
    """A Proxmox LXC container."""

    kind: Literal["pct"]
    id: int
    rootfs: str | None = None  # host-side path of its filesystem, if reading it directly is wanted


class RootfsContainer(Strict):
    """A container read through the host-side path of its root filesystem."""

    kind: Literal["rootfs"]
    path: str


class DockerContainer(Strict):
    kind: Literal["docker"]
    name: str


CONTAINER_SECTIONS: tuple[type[Strict], ...] = (PctContainer, RootfsContainer, DockerContainer)
# The inventory's `container:` section: whichever kind its `kind` key names.
Container = Annotated[reduce(operator.or_, CONTAINER_SECTIONS), Field(discriminator="kind")]
