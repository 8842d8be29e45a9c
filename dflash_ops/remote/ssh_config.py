"""Where ssh really goes for an inventory host: `ssh -G` resolves an address as the OpenSSH
client does (Host and Match blocks, HostName, Port, ProxyJump, ProxyCommand) without
connecting, so probes and messages name the machine ssh and Fabric will reach, not the alias.

The command and its parser are two small pieces (the parser is tested on captured output).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from dflash_ops.core.errors import HostError

SSH_G_TIMEOUT_S = 10.0  # `ssh -G` reads files only; a Match exec may run a command


@dataclass(frozen=True)
class Endpoint:
    """An inventory address after the ssh config: the host and port ssh connects to, and the
    jump host or proxy command in between (None when it connects directly)."""

    hostname: str
    port: int
    proxy: str | None = None

    def __str__(self) -> str:
        return f"{self.hostname}:{self.port}"


def ssh_g_argv(address: str, port: int | None, ssh_config: str | None) -> list[str]:
    """`ssh -G` for an inventory address. The inventory's port, when set, wins over the
    config's (as it does for the connections); the inventory's `ssh_config` as for them."""
    argv = ["ssh", "-G"]
    if ssh_config:
        argv += ["-F", "/dev/null" if ssh_config == "none" else str(Path(ssh_config).expanduser())]
    if port is not None:
        argv += ["-p", str(port)]
    return [*argv, "--", address]


def parse_ssh_g(output: str, address: str) -> Endpoint:
    """`ssh -G` prints one lower-case `key value` per line; the ones that say where to go."""
    settings: dict[str, str] = {}
    for line in output.splitlines():
        key, _, value = line.partition(" ")
        settings.setdefault(key, value.strip())
    proxy = None
    for key, label in (("proxyjump", "ProxyJump"), ("proxycommand", "ProxyCommand")):
        value = settings.get(key, "none")
        if value.lower() != "none":
            proxy = f"{label} {value}"
    return Endpoint(settings.get("hostname") or address, int(settings.get("port") or 22), proxy)


def resolve(name: str, address: str, port: int | None, ssh_config: str | None) -> Endpoint:
    """The endpoint ssh would use for inventory host `name`; a config ssh rejects is an error
    naming the host (every connection would fail the same way)."""
    argv = ssh_g_argv(address, port, ssh_config)
    try:
        answer = subprocess.run(
            argv, capture_output=True, text=True, timeout=SSH_G_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        raise HostError(name, "OpenSSH client not found: install openssh-client") from None
    except subprocess.TimeoutExpired:
        raise HostError(
            name, f"`ssh -G {address}` took over {SSH_G_TIMEOUT_S:.0f}s: check your ssh config"
        ) from None
    if answer.returncode != 0:
        lines = [line for line in answer.stderr.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit {answer.returncode}"
        raise HostError(
            name,
            f"ssh cannot read its config for {address} ({reason}); fix the ssh config "
            "(or the inventory's `ssh_config`) so that `ssh -G` accepts it.",
        )
    return parse_ssh_g(answer.stdout, address)
