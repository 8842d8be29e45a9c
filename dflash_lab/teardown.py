"""Removing a lab: every process, mount, namespace, link and file its state records."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from dflash_lab import disks, network, processes, sshd
from dflash_lab.state import LabState
from dflash_lab.system import attempt
from dflash_ops.remote.routes import network_namespaces

if TYPE_CHECKING:
    from dflash_lab.lab import Lab


def down(lab: Lab) -> list[str]:
    """Remove everything the lab made. Returns what could not be removed (empty: clean)."""
    state = lab.state
    problems: list[str] = []
    for name, record in state.hosts.items():
        if record.pid and processes.alive(record.pid):
            attempt(problems, f"stop sshd of {name}", lambda r=record: processes.kill(r.pid))
    for netns in state.namespaces:
        for pid in processes.netns_pids(netns):  # sessions and what they started
            attempt(problems, f"stop pid {pid} in {netns}", lambda p=pid: processes.kill(p))
    _remove_mounts_and_links(state, problems)
    for netns in state.namespaces:
        attempt(problems, f"delete netns {netns}", lambda n=netns: network.delete_namespace(n))
    _remove_run_sshd(state)
    if not problems:
        shutil.rmtree(lab.root, ignore_errors=True)
        if lab.root.exists():
            problems.append(f"could not remove {lab.root}")
    return problems


def leftovers(lab: Lab) -> list[str]:
    """What of this lab still exists on the machine (for tests and `lab-status`)."""
    found = _on_the_machine(lab)
    if lab.root.exists():
        found.append(f"directory {lab.root}")
    return found


def _remove_mounts_and_links(state: LabState, problems: list[str]) -> None:
    for mount in reversed(state.mounts):
        attempt(problems, f"unmount {mount}", lambda m=mount: disks.unmount(m))
    for link in state.links:
        attempt(problems, f"delete link {link}", lambda n=link: network.delete_link(n))


def _on_the_machine(lab: Lab) -> list[str]:
    """The namespaces, links, mounts and listeners of the lab that exist."""
    state = lab.state
    found = [f"netns {n}" for n in state.namespaces if n in network_namespaces()]
    found += [f"link {link}" for link in state.links if network.link_exists(link)]
    mounted = disks.mount_points()
    found += [f"mount {mount}" for mount in state.mounts if mount in mounted]
    found += [
        f"sshd pid {record.pid} ({name})"
        for name, record in state.hosts.items()
        if sshd.running(lab, name)
    ]
    return found


def _remove_run_sshd(state: LabState) -> None:
    """sshd's privilege-separation directory: ours to remove only when no lab is left."""
    if state.created_run_sshd and not any(
        netns.startswith(network.NAMESPACE_PREFIX) for netns in network_namespaces()
    ):
        shutil.rmtree("/run/sshd", ignore_errors=True)
