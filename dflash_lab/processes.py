"""Finding and stopping the lab's processes: an sshd listener by its pid, and what runs
inside a lab host's network namespace."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from dflash_lab.system import poll


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def kill(pid: int) -> None:
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        return
    if not wait_dead(pid, timeout=3):
        os.kill(pid, 9)
        wait_dead(pid)


def wait_dead(pid: int, timeout: float = 5) -> bool:
    return bool(poll(lambda: not alive(pid), timeout))


def netns_pids(netns: str) -> list[int]:
    output = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
    return [int(pid) for pid in output.split()]
