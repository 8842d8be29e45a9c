"""The network-safety guard for lab inventories (DESIGN.md, "Network safety").

A lab inventory names the lab's state file. Its addresses may be used only while the lab's own
network namespaces exist and each address routes through the lab's own veth: otherwise the
same address could reach a real machine. This module reads that state file itself (only the
fields it needs), so the product never imports the lab package.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from dflash_ops.core.errors import LabError
from dflash_ops.remote.ssh_config import Endpoint

NETNS_DIR = "/run/netns"  # where `ip netns add` mounts a named namespace


def verify_routes(state_file: Path) -> None:
    """Refuse unless every lab address is reached through the lab's own veth right now."""
    state = _lab_state(state_file)
    namespaces = network_namespaces() if state.get("mode") == "netns" else []
    for name, record in state.get("hosts", {}).items():
        address = record.get("address")
        if state.get("mode") != "netns":
            if address != "127.0.0.1":
                raise LabError(f"lab host {name} has non-loopback address {address}")
            continue
        if record.get("netns") not in namespaces:
            raise LabError(
                f"lab namespace {record.get('netns')} of {name} is gone; refusing "
                f"to connect to {address}. Run `dflash-lab up` again."
            )
        device = route_device(address)
        if device != record.get("veth"):
            raise LabError(
                f"lab host {name}'s address {address} routes via {device}, not the "
                f"lab's veth {record.get('veth')}; refusing to connect."
            )


def require_lab_endpoint(state_file: Path, name: str, endpoint: Endpoint) -> None:
    """A lab inventory's host, after the ssh config, must be one of the lab's own addresses,
    reached directly: an alias must not lead a test anywhere else."""
    state = _lab_state(state_file)
    addresses = {record.get("address") for record in state.get("hosts", {}).values()}
    if endpoint.proxy is not None or endpoint.hostname not in addresses:
        via = f" via {endpoint.proxy}" if endpoint.proxy else ""
        raise LabError(
            f"lab inventory host {name} resolves to {endpoint}{via}, not one of the lab's "
            f"addresses ({', '.join(sorted(a for a in addresses if a))}); refusing to connect."
        )


def _lab_state(state_file: Path) -> dict:
    state_file = Path(state_file)
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        raise LabError(
            f"no lab at {state_file.parent} ({state_file.name} missing); run `dflash-lab up`"
        ) from None
    except (OSError, ValueError) as exc:
        raise LabError(
            f"lab state {state_file} is unreadable ({exc}); refusing to connect to "
            "its addresses. Run `dflash-lab down` and `dflash-lab up`."
        ) from None
    return state


def network_namespaces() -> list[str]:
    """The named network namespaces: what `ip netns list` lists, without starting it (this
    runs before every connection to a lab host)."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def route_device(address: str) -> str:
    """The device `ip route get` picks for `address` ('none' when there is no route)."""
    route = subprocess.run(
        ["ip", "-o", "route", "get", address], capture_output=True, text=True
    ).stdout.split()
    return route[route.index("dev") + 1] if "dev" in route else "none"
