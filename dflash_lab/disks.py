"""Each host's data directory (and the workstation's staging directory) as its own
size-limited tmpfs, so that free-space checks and disk-full are real. Without root they are
plain directories."""

from __future__ import annotations

from pathlib import Path

from dflash_lab.state import LabState
from dflash_lab.system import run, run_ok
from dflash_ops.core.units import parse_size


def mount_tmpfs(state: LabState, directory: Path, size: str) -> None:
    """Mount a tmpfs of `size` on `directory` (netns mode only), recorded in the state."""
    if state.mode != "netns":
        return
    options = f"size={parse_size(size)},mode=0755"
    run(["mount", "-t", "tmpfs", "-o", options, f"dflash-lab-{directory.name}", str(directory)])
    state.mounts.append(str(directory))
    state.save()


def mount_points() -> set[str]:
    """Every mount point of this machine (as this process sees them)."""
    with open("/proc/self/mounts") as mounts:
        return {line.split()[1] for line in mounts}


def unmount(path: str) -> None:
    if path in mount_points() and not run_ok(["umount", path]):
        run(["umount", "-l", path])  # something still holds it open: detach lazily
