"""Finding and stopping the lab's processes: an sshd listener by its pid, and everything that
runs inside a lab host's network namespace (sessions, and what they left running).

A pid is signalled through a pidfd opened *before* checking that it is still the process
meant (that listener, a member of that namespace), so a pid that exited and was reused by an
unrelated process is never signalled. Only live processes count: PID 1 on these machines
does not reap orphans, so killed processes can linger as zombies, which hold nothing open.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from dflash_lab.system import poll
from dflash_ops.core.errors import LabError

TERM_GRACE = 3.0  # seconds processes get to exit on SIGTERM before they are SIGKILLed
KILL_WAIT = 2.0  # seconds SIGKILLed processes get to be gone, per round
KILL_ROUNDS = 10  # each SIGKILL round also catches what the last one's targets forked


def is_live(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as file:  # "pid (command) state ..."
            state = file.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def describe(pids: list[int]) -> str:
    """'123 (sleep 600), 130 (sshd: root@notty)' for messages."""
    return ", ".join(f"{pid} ({command_line(pid) or '?'})" for pid in pids)


def signal_if(pid: int, sig: int, is_it: Callable[[int], bool]) -> bool:
    """Send `sig` to `pid` if `is_it(pid)` still holds; whether it was sent."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if not is_it(pid):
            return False
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


def stop(pid: int, is_it: Callable[[int], bool]) -> None:
    """SIGTERM `pid`, then SIGKILL it after a grace period, while `is_it(pid)` holds (it must
    be false once the process is gone); LabError if it outlives both."""
    for sig, wait in ((signal.SIGTERM, TERM_GRACE), (signal.SIGKILL, KILL_WAIT)):
        if not signal_if(pid, sig, is_it):
            return  # gone already, or the pid is someone else's now
        if poll(lambda: not is_it(pid), wait):
            return
    raise LabError(f"pid {pid} ({command_line(pid)}) is still alive after SIGKILL")


def in_namespace(pid: int, inode: int) -> bool:
    """Whether `pid` is a live process in the network namespace with this nsfs inode."""
    try:
        link = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:  # gone, or a zombie (which no longer has namespaces)
        return False
    return link == f"net:[{inode}]" and is_live(pid)


def matching(is_it: Callable[[int], bool]) -> list[int]:
    """The processes of the machine (not this one) for which `is_it(pid)` holds."""
    own = os.getpid()
    pids = (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
    return [pid for pid in pids if pid != own and is_it(pid)]


def namespace_processes(inode: int) -> list[int]:
    """The live processes in the network namespace with this nsfs inode (not this one)."""
    return matching(lambda pid: in_namespace(pid, inode))


def empty_namespace(inode: int) -> list[int]:
    """Stop every process in a network namespace: SIGTERM with a grace period, then SIGKILL
    rounds until none is left (bounded). Returns the live processes that remain."""

    def member(pid: int) -> bool:
        return in_namespace(pid, inode)

    rounds = [(signal.SIGTERM, TERM_GRACE)] + [(signal.SIGKILL, KILL_WAIT)] * KILL_ROUNDS
    for sig, wait in rounds:
        targets = namespace_processes(inode)
        if not targets:
            return []
        for pid in targets:
            signal_if(pid, sig, member)
        poll(lambda targets=targets: not any(member(pid) for pid in targets), wait)
    return namespace_processes(inode)
