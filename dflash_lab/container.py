"""The trainer's "Proxmox container": a directory playing its rootfs on the trainer's disk,
and the TEST STAND-IN for Proxmox's `pct` (dflash_lab/stand_ins/pct) on the trainer's PATH,
configured by a `pct.conf` next to it.

As root the inventory reaches the container through `pct` (the stand-in chroots, which needs
root); without root, through its rootfs path instead.
"""

from __future__ import annotations

import shlex
import shutil
from importlib.resources import as_file, files
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_lab.state import CONTAINER_ID, TRAINER

if TYPE_CHECKING:
    from dflash_lab.lab import Lab

STAND_IN = "stand_ins/pct"  # inside the dflash_lab package


def make_container(lab: Lab) -> None:
    """The container's rootfs (a merged-/usr skeleton) and `pct` on the trainer's PATH."""
    rootfs = lab.container_rootfs
    for sub in ("usr", "etc", "dev", "proc", "tmp", "workspace/checkpoints"):
        (rootfs / sub).mkdir(parents=True)
    for link in ("bin", "sbin", "lib", "lib64"):  # merged-/usr layout, as in Debian 12
        if Path(f"/{link}").is_symlink():
            (rootfs / link).symlink_to(f"usr/{link}")
    lab.set_container_running(True)
    install_pct(lab)


def install_pct(lab: Lab) -> None:
    """Copy the stand-in onto the trainer's PATH, with the pct.conf that names the container."""
    bin_dir = lab.host_dir(TRAINER) / "bin"
    with as_file(files("dflash_lab").joinpath(STAND_IN)) as script:
        shutil.copyfile(script, bin_dir / "pct")
    (bin_dir / "pct").chmod(0o755)
    settings = {
        "CT_ID": CONTAINER_ID,
        "ROOTFS": lab.container_rootfs,
        "STATE": lab.container_state_file,
    }
    lines = [f"{key}={shlex.quote(str(value))}" for key, value in settings.items()]
    header = "# The container the lab's pct stand-in plays; written by dflash_lab.container."
    (bin_dir / "pct.conf").write_text("\n".join([header, *lines]) + "\n")


def container_access(lab: Lab) -> dict:
    """The trainer's `container:` inventory entry."""
    rootfs = str(lab.container_rootfs)
    if lab.state.mode == "netns":
        return {"kind": "pct", "id": CONTAINER_ID, "rootfs": rootfs}
    return {"kind": "rootfs", "path": rootfs}
