"""Removing a lab so that nothing of it is left on the machine, and saying what is.

`down()` works from the lab's state, in this order:

1. every sshd listener, so that no new session can start;
2. every live process in each host's network namespace (open sessions, and whatever they
   left running detached): SIGTERM, then SIGKILL rounds until none is left;
3. the tmpfs mounts, the veth links, then the namespaces; a namespace whose processes would
   not die is kept, so that a later `dflash-lab down` can still find them by its name;
4. verify: no process is left in any of the namespaces (named or not), and nothing the state
   records exists any more. Only then is the lab's directory removed.

While this runs, each namespace is held open by a file descriptor: that keeps its identity
(the nsfs inode that /proc/PID/ns/net points at) from being given to a new namespace, so the
processes of a namespace whose name is already deleted can still be found, and only those.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_lab import disks, network, processes, sshd, users
from dflash_lab.state import LabState
from dflash_lab.system import attempt
from dflash_ops.remote.routes import network_namespaces

if TYPE_CHECKING:
    from dflash_lab.lab import Lab

NETNS_DIR = Path("/run/netns")  # where `ip netns add` names namespaces


def down(lab: Lab) -> list[str]:
    """Remove everything the lab made. Returns what could not be removed (empty: clean)."""
    state = lab.state
    problems: list[str] = []
    for name in state.hosts:
        attempt(problems, f"stop sshd of {name}", lambda name=name: sshd.stop(lab, name))
    # Under the slot lock until checked: a lab coming up meanwhile would claim the slot as
    # soon as its namespaces are gone, and its namespaces (same names) would read as ours.
    with _slot_held(state), _held_open(_own_namespaces(state)) as inodes:
        stubborn = [netns for netns, inode in inodes.items() if processes.empty_namespace(inode)]
        _remove_mounts_and_links(state, problems)
        for netns in (n for n in inodes if n not in stubborn):
            attempt(
                problems,
                f"delete netns {netns}",
                lambda n=netns: network.delete_namespace(state, n),
            )
        # A process can still enter a namespace after it was emptied (an sshd that was
        # daemonizing): held open, its namespace is still found, and emptied again (a
        # stubborn one has had its rounds).
        for netns, inode in inodes.items():
            if netns not in stubborn:
                processes.empty_namespace(inode)
        problems += _processes_left(inodes, stubborn)
        _remove_run_sshd(state)
        users.remove(lab, problems)
        problems += [f"{thing} is still there" for thing in _on_the_machine(lab)]
    if not problems:
        shutil.rmtree(lab.root, ignore_errors=True)
        if lab.root.exists():
            problems.append(f"could not remove {lab.root}")
    return problems


def leftovers(lab: Lab) -> list[str]:
    """What of this lab still exists on the machine (for tests and `dflash-lab status`)."""
    found = _on_the_machine(lab)
    if lab.root.exists():
        found.append(f"directory {lab.root}")
    return found


def _remove_mounts_and_links(state: LabState, problems: list[str]) -> None:
    for mount in reversed(state.mounts):
        attempt(problems, f"unmount {mount}", lambda m=mount: disks.unmount(m))
    for link in state.links:
        attempt(problems, f"delete link {link}", lambda n=link: network.delete_link(state, n))


def _processes_left(inodes: dict[str, int], stubborn: list[str]) -> list[str]:
    problems = []
    for netns, inode in inodes.items():
        live = processes.namespace_processes(inode)
        if live:
            kept = "kept for `dflash-lab down` to retry" if netns in stubborn else "name deleted"
            problems.append(
                f"{len(live)} process(es) in netns {netns} ({kept}) would not die: "
                f"{processes.describe(live)}"
            )
    return problems


def _on_the_machine(lab: Lab) -> list[str]:
    """The namespaces, their processes, links, mounts and listeners of the lab that exist."""
    state = lab.state
    present = _own_namespaces(state)
    found = [f"netns {netns}" for netns in present]
    for netns in present:
        with _held_open([netns]) as inodes:
            for inode in inodes.values():
                found += [
                    f"process {pid} ({processes.command_line(pid)}) in netns {netns}"
                    for pid in processes.namespace_processes(inode)
                ]
    found += [f"link {link}" for link in state.links if network.own_link(state, link)]
    mounted = disks.mount_points()
    found += [f"mount {mount}" for mount in state.mounts if mount in mounted]
    found += [
        f"sshd pid {record.pid} ({name})"
        for name, record in state.hosts.items()
        if sshd.running(lab, name)
    ]
    return found + users.leftovers(lab)


def _own_namespaces(state: LabState) -> list[str]:
    """The recorded namespaces that exist and are this lab's: a stale record (a lab whose
    teardown failed half-way) names namespaces a later lab in its slot may have made again."""
    return [netns for netns in state.namespaces if network.own_namespace(state, netns)]


def _slot_held(state: LabState) -> AbstractContextManager[None]:
    """The machine-wide slot lock for a lab of namespaces (loopback labs have no slot)."""
    return network.slot_lock() if state.namespaces else nullcontext()


@contextmanager
def _held_open(namespaces: list[str]) -> Iterator[dict[str, int]]:
    """{name: nsfs inode} of those of `namespaces` that exist, each held open meanwhile."""
    descriptors: dict[str, int] = {}
    try:
        for netns in namespaces:
            try:
                descriptors[netns] = os.open(NETNS_DIR / netns, os.O_RDONLY)
            except FileNotFoundError:
                continue
        yield {netns: os.fstat(fd).st_ino for netns, fd in descriptors.items()}
    finally:
        for fd in descriptors.values():
            os.close(fd)


def _remove_run_sshd(state: LabState) -> None:
    """sshd's privilege-separation directory: ours to remove only when no lab is left."""
    if state.created_run_sshd and not any(
        netns.startswith(network.NAMESPACE_PREFIX) for netns in network_namespaces()
    ):
        shutil.rmtree("/run/sshd", ignore_errors=True)
