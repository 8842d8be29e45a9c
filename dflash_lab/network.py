"""The lab's network: a namespace per host, joined to the workstation (this machine's root
namespace) by its own veth pair, with addresses from a /24 "slot" of 10.231.0.0/16 that no
other lab on this machine uses. Without root, hosts are sshd ports on loopback instead.

Slot N gives host i the /30 10.231.N.4i: .4i+1 is the workstation's end, .4i+2 the host's.
Namespaces have no routes to each other, so (as with the real servers) the trainer cannot
reach an eval host; only the workstation reaches both.

Several labs may be built at the same moment (parallel test runs): a slot is chosen and its
namespaces and links are created while holding an exclusive lock on `SLOT_LOCK`, so that no
two labs pick the same slot.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dflash_lab.state import HostRecord, LabState
from dflash_lab.system import poll, run, run_ok
from dflash_ops.core.errors import LabError
from dflash_ops.remote.routes import network_namespaces

SUBNET_PREFIX = "10.231"
NAMESPACE_PREFIX = "dflab"  # dflab<slot>-<host>
# /run/lock is the system's place for lock files; a lock file is never removed (removing one
# that another process is about to lock would let two holders in).
_LOCK_DIR = Path("/run/lock") if Path("/run/lock").is_dir() else Path(tempfile.gettempdir())
SLOT_LOCK = _LOCK_DIR / "dflash-lab-slots.lock"
SLOT_LOCK_TIMEOUT = 120.0  # seconds; a lab's up or down holds the lock for about one


@contextmanager
def slot_lock(path: Path = SLOT_LOCK) -> Iterator[None]:
    """Hold the machine-wide lock under which labs choose and claim their slots."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not poll(lambda: _try_lock(descriptor), SLOT_LOCK_TIMEOUT):
            raise LabError(
                f"another lab held {path} for {SLOT_LOCK_TIMEOUT:g}s; check for a hung "
                f"`dflash-lab up` (`fuser {path}`) and try again"
            )
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _try_lock(descriptor: int) -> bool:
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def free_slot(in_use: Callable[[int], bool] = lambda slot: False) -> int:
    """The lowest slot whose addresses and namespace names nothing on this machine uses, nor
    `in_use` says is held (a user of the slot's name, left while a lab tears down).
    Call it under `slot_lock()`, and claim the slot (create its namespace) before leaving."""
    taken = run(["ip", "-o", "-4", "addr"]) + run(["ip", "-4", "route"])
    names = network_namespaces()
    for slot in range(1, 250):
        if (
            f"{SUBNET_PREFIX}.{slot}." not in taken
            and not any(name.startswith(f"{NAMESPACE_PREFIX}{slot}-") for name in names)
            and not in_use(slot)
        ):
            return slot
    raise LabError(f"no free {SUBNET_PREFIX}.N.0/24 range for the lab; remove old labs")


def add_namespace_host(state: LabState, name: str, index: int, data_dir: Path) -> HostRecord:
    """Create host `name`'s namespace and veth pair in the lab's slot, recording each in the
    state as it is made (so a failure half-way is still cleaned up)."""
    netns = f"{NAMESPACE_PREFIX}{state.slot}-{name}"
    veth = f"dfl{state.slot}h{index}"
    workstation_ip = f"{SUBNET_PREFIX}.{state.slot}.{4 * index + 1}"
    address = f"{SUBNET_PREFIX}.{state.slot}.{4 * index + 2}"
    run(["ip", "netns", "add", netns])
    run(["ip", "-n", netns, "link", "set", "dev", "lo", "alias", mark(state)])
    state.namespaces.append(netns)
    state.save()
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p"])
    run(["ip", "link", "set", "dev", veth, "alias", mark(state)])
    state.links.append(veth)
    state.save()
    run(["ip", "link", "set", f"{veth}p", "netns", netns])
    run(["ip", "addr", "add", f"{workstation_ip}/30", "dev", veth])
    run(["ip", "link", "set", veth, "up"])
    run(["ip", "-n", netns, "addr", "add", f"{address}/30", "dev", f"{veth}p"])
    run(["ip", "-n", netns, "link", "set", f"{veth}p", "up"])
    run(["ip", "-n", netns, "link", "set", "lo", "up"])
    return HostRecord(name, address, 22, str(data_dir), netns, veth)


def loopback_host(name: str, data_dir: Path) -> HostRecord:
    """A host as an sshd port on loopback (the lab without root)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return HostRecord(name, "127.0.0.1", port, str(data_dir))


def in_namespace(record: HostRecord, argv: list[str]) -> list[str]:
    """argv to run a local command inside the host's namespace; unchanged on loopback."""
    return ["ip", "netns", "exec", record.netns, *argv] if record.netns else list(argv)


def exec_in(record: HostRecord, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(in_namespace(record, argv), capture_output=True, text=True, **kwargs)


def port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def mark(state: LabState) -> str:
    """The alias this lab gives each namespace's loopback and each of its links: whose they are."""
    return f"dflab-{state.token}"


def link_exists(link: str) -> bool:
    return run_ok(["ip", "link", "show", link])


def own_link(state: LabState, link: str) -> bool:
    """The link exists and this lab made it (a later lab in the slot reuses its name)."""
    return link_exists(link) and _is_marked(state, ["ip", "-o", "link", "show", "dev", link])


def own_namespace(state: LabState, netns: str) -> bool:
    """The namespace exists and this lab made it (a later lab in the slot reuses its name)."""
    return netns in network_namespaces() and _is_marked(
        state, ["ip", "-n", netns, "-o", "link", "show", "dev", "lo"]
    )


def _is_marked(state: LabState, show: list[str]) -> bool:
    if not state.token:  # recorded before marks: known by name only
        return True
    found = re.search(r"\balias (\S+)", subprocess.run(show, capture_output=True, text=True).stdout)
    return found is not None and found[1] == mark(state)


def delete_link(state: LabState, link: str) -> None:
    if own_link(state, link):
        run(["ip", "link", "del", link])


def delete_namespace(state: LabState, netns: str) -> None:
    if own_namespace(state, netns):
        run(["ip", "netns", "del", netns])
