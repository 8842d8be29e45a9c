"""How to talk to one inventory host: Fabric for small commands, OpenSSH argv for bulk bytes.

Both are built from the same inventory entry (user, port, key, known_hosts, timeout), so a
transfer goes exactly where the control commands went. Host keys are always verified: an
unknown or changed key is refused, never added.

With `become: sudo` every command on the host — control commands, the relay's reader and
writer, held commands, uploads — runs as `sudo -n -- bash -c 'COMMAND'` (`login_command`):
non-interactive, so a missing NOPASSWD rule is an error that says so, never a prompt.
"""

from __future__ import annotations

import io
import shlex
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TypeVar

import paramiko
from fabric import Config, Connection

from dflash_ops.core.errors import (
    AuthenticationError,
    HostError,
    HostKeyError,
    RemoteCommandError,
    UnreachableError,
)
from dflash_ops.core.inventory import EvalHost, FeaturesHost, HostEntry, Inventory
from dflash_ops.core.units import format_bytes
from dflash_ops.remote import probes
from dflash_ops.remote.capture import CapturingRemote
from dflash_ops.remote.containers import HOST_ITSELF, HostItself, environment_of
from dflash_ops.remote.messages import stderr_reason, sudo_advice
from dflash_ops.remote.probes import Probe
from dflash_ops.remote.routes import require_lab_endpoint, verify_routes
from dflash_ops.remote.ssh_config import Endpoint, resolve

T = TypeVar("T")

# AES-GCM is the fastest cipher with AES-NI; chacha20 is the fallback. '^' puts them first
# while keeping the server's other choices acceptable.
FAST_CIPHERS = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com"
KEEPALIVE_COUNT = 4  # keepalives without an answer before a connection counts as dead
HANDSHAKE_ATTEMPTS = 3  # for a session the server drops during the handshake (Host.open)


@dataclass(frozen=True)
class Result:
    stdout: str
    stderr: str
    exit_code: int

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class _DroppedHandshake(Exception):
    """The server closed the session before it was authenticated."""


class Host:
    """One inventory host. `name` is its inventory key (used in every message)."""

    def __init__(self, inventory: Inventory, name: str) -> None:
        self.inventory = inventory
        self.name = name
        self.entry: HostEntry = inventory.hosts[name]

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.target})"

    @property
    def target(self) -> str:
        user = f"{self.entry.user}@" if self.entry.user else ""
        if self.endpoint.hostname == self.entry.address:
            return f"{user}{self.endpoint}"
        return f"{user}{self.entry.address} ({self.endpoint})"

    @cached_property
    def endpoint(self) -> Endpoint:
        """Where ssh goes for this host, after the ssh config (HostName, Port, ProxyJump)."""
        endpoint = resolve(
            self.name, self.entry.address, self.entry.port, self.inventory.ssh_config
        )
        if self.inventory.lab is not None:
            require_lab_endpoint(self.inventory.lab, self.name, endpoint)
        return endpoint

    def _check_lab(self) -> None:
        """A lab inventory names addresses that may be used only while the lab's own network
        namespaces exist: its routes, and where this host's alias leads, before every
        connection (a few ms)."""
        if self.inventory.lab is not None:
            verify_routes(self.inventory.lab)
            _ = self.endpoint

    @property
    def known_hosts(self) -> Path:
        return Path(self.entry.known_hosts).expanduser()

    # --- who runs the commands --------------------------------------------------------------

    @property
    def becomes_root(self) -> bool:
        return self.entry.become == "sudo"

    @property
    def environment(self) -> HostItself:
        """Where this host's commands run: a features host's container (entered as staging
        enters the trainer's), else the host itself. The trainer's container is not entered
        here: staging decides per command how to reach it (stream, pull, rootfs)."""
        if isinstance(self.entry, FeaturesHost):
            return environment_of(self.entry.container)
        return HOST_ITSELF

    @property
    def through_shell(self) -> bool:
        """Files move through `cat` in a command (not SFTP as the login user): under sudo, or
        into a container SFTP cannot see."""
        return self.becomes_root or self.environment is not HOST_ITSELF

    def login_command(self, command: str) -> str:
        """`command` as the login shell must be given it: under the tool's own umask (what it
        creates is never group/world-writable, whatever the login's umask; a command wanting
        0700/0600 sets 077 itself), inside the host's container, through `sudo -n` with
        `become`."""
        command = self.environment.wrap(with_umask(SHARED_UMASK, command))
        if not self.becomes_root:
            return command
        return f"sudo -n -- bash -c {shlex.quote(command)}"

    def root_hint(self) -> str:
        """For a message about something denied: what to do when the login is not root."""
        if self.becomes_root or self.entry.user in (None, "root"):
            return ""
        return (
            f" The login user {self.entry.user} is not root: if this needs root (pct, "
            f"root-only files), set `become: sudo` on hosts.{self.name} in "
            f"{self.inventory.path} and give {self.entry.user} passwordless sudo there."
        )

    def access_hint(self, path: str) -> str:
        """For `path` found missing: when a non-root login without `become` is denied the way
        to it (it may be there, root's), that reason and `root_hint`; else nothing."""
        hint = self.root_hint()
        if not hint:
            return ""
        seen = self.run(f"ls -d -- {shlex.quote(path)}", check=False)
        if "permission denied" not in seen.stderr.lower():
            return ""
        reason = stderr_reason(seen.stderr)
        return f"; but {path} may be there, hidden from {self.entry.user}: {reason}.{hint}"

    def _require_sudo(self, result: Result) -> None:
        """`sudo -n` itself failed (no NOPASSWD rule, no sudo): not the command's fault."""
        if not self.becomes_root or result.exit_code not in (1, 127):
            return
        reasons = [
            line.strip()
            for line in result.stderr.splitlines()
            if (line.startswith("sudo: ") or "sudo: command not found" in line)
            and "unable to resolve host" not in line  # a warning: the command still ran
        ]
        if reasons:
            raise HostError(self.name, sudo_advice(self.entry.user, reasons[0]))

    # --- control plane (Fabric) -----------------------------------------------------------

    @cached_property
    def connection(self) -> Connection:
        """A Fabric Connection that refuses unknown or changed host keys."""
        self._check_lab()
        overrides: dict = {
            "load_ssh_configs": self.inventory.ssh_config != "none",
            "runners": {"remote": CapturingRemote},
        }
        if self.inventory.ssh_config not in (None, "none"):
            overrides["ssh_config_path"] = str(Path(self.inventory.ssh_config).expanduser())
        connect_kwargs: dict = {"look_for_keys": self.entry.identity_file is None}
        if self.entry.identity_file:
            connect_kwargs["key_filename"] = str(Path(self.entry.identity_file).expanduser())
        connection = Connection(
            self.entry.address,
            user=self.entry.user,
            port=self.entry.port,
            connect_timeout=self.entry.connect_timeout,
            connect_kwargs=connect_kwargs,
            config=Config(overrides=overrides),
        )
        # Fabric defaults to AutoAddPolicy, which would trust any key: replace it.
        connection.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        if self.known_hosts.exists():
            connection.client.load_host_keys(str(self.known_hosts))
        return connection

    def port_open(self) -> bool:
        """Whether the SSH port accepts a direct TCP connection within the connect timeout
        (meaningless behind a ProxyJump/ProxyCommand: `endpoint.proxy` says when)."""
        self._check_lab()
        try:
            with socket.create_connection(
                (self.endpoint.hostname, self.endpoint.port), timeout=self.entry.connect_timeout
            ):
                return True
        except OSError:
            return False

    def open(self) -> None:
        """Connect and authenticate, translating failures into clear HostErrors. A session
        the server drops during the handshake (sshd's MaxStartups refusing a burst of new
        connections, a restarting sshd) is tried again, twice, after 1 s and 2 s; a refused
        or timed-out connection, a host key or an authentication failure is not."""
        for attempt in range(1, HANDSHAKE_ATTEMPTS + 1):
            try:
                return self._open_once()
            except _DroppedHandshake as dropped:
                if attempt == HANDSHAKE_ATTEMPTS:
                    raise UnreachableError(
                        self.name,
                        f"SSH to {self.target} failed: {dropped} ({attempt} attempts: the "
                        f"server closed the session during the handshake). Check the host's "
                        f"sshd (its log, MaxStartups) and try again.",
                    ) from None
                time.sleep(attempt)

    def _open_once(self) -> None:
        self._require_identity_file()
        try:
            self.connection.open()
            self.connection.transport.set_keepalive(self.inventory.transfer.keepalive)
            _no_delay(self.connection.transport.sock)
        except paramiko.BadHostKeyException as exc:
            self._forget_connection()
            raise HostKeyError(
                self.name,
                f"host key of {self.endpoint} does NOT match "
                f"{self.known_hosts} (expected {exc.expected_key.get_name()} "
                f"{exc.expected_key.get_fingerprint().hex()}, got {exc.key.get_name()} "
                f"{exc.key.get_fingerprint().hex()}). Refusing to connect. If the host was "
                f"really reinstalled, remove the old entry with `ssh-keygen -R "
                f"{self._known_hosts_name} -f {self.known_hosts}` and add the new one.",
            ) from None
        except paramiko.SSHException as exc:
            self._forget_connection()
            if "not found in known_hosts" in str(exc):
                raise HostKeyError(
                    self.name,
                    f"host key of {self.endpoint} is not in "
                    f"{self.known_hosts}; refusing an unverified host. Check the key out of "
                    f"band, then add it: `ssh-keyscan -p {self.endpoint.port} "
                    f"{self.endpoint.hostname} >> {self.known_hosts}`.",
                ) from None
            if isinstance(exc, paramiko.AuthenticationException):
                raise AuthenticationError(
                    self.name,
                    f"{self.target} refused authentication ({exc}). Check `user` and "
                    f"`identity_file` in the inventory, or your ssh agent.",
                ) from None
            raise _DroppedHandshake(str(exc)) from None
        except (EOFError, ConnectionResetError) as exc:
            self._forget_connection()
            raise _DroppedHandshake(
                _os_reason(exc) if isinstance(exc, OSError) else "EOF"
            ) from None
        except OSError as exc:
            self._forget_connection()
            reason = "timed out" if isinstance(exc, socket.timeout) else _os_reason(exc)
            raise UnreachableError(
                self.name,
                f"cannot connect to {self.target}: {reason}. Is the host up and its sshd "
                f"running? Check `address`/`port` in the inventory.",
            ) from None

    def _require_identity_file(self) -> None:
        if self.entry.identity_file is None:
            return
        key = Path(self.entry.identity_file).expanduser()
        if not key.is_file():
            raise AuthenticationError(
                self.name,
                f"identity_file {key} does not exist on this workstation. Fix "
                f"`hosts.{self.name}.identity_file` in {self.inventory.path}, or remove it to "
                f"use your ssh agent and default keys.",
            )

    @property
    def keepalive_window(self) -> float:
        """Seconds after which a silent connection is taken for dead."""
        return self.inventory.transfer.keepalive * KEEPALIVE_COUNT

    def close(self) -> None:
        if "connection" in self.__dict__:
            self.connection.close()

    def _forget_connection(self) -> None:
        self.__dict__.pop("connection", None)

    @property
    def _known_hosts_name(self) -> str:
        if self.endpoint.port == 22:
            return self.endpoint.hostname
        return f"[{self.endpoint.hostname}]:{self.endpoint.port}"

    def run(
        self,
        command: str,
        *,
        check: bool = True,
        timeout: float | None = None,
        as_login_user: bool = False,
    ) -> Result:
        """Run a shell command (under sudo with `become`, unless `as_login_user`); output is
        captured, never echoed."""
        self.open()
        line = command if as_login_user else self.login_command(command)
        try:
            raw = self.connection.run(line, hide=True, warn=True, in_stream=False, timeout=timeout)
        except paramiko.SSHException as exc:
            raise UnreachableError(
                self.name, f"lost the SSH session to {self.target}: {exc}"
            ) from None
        result = Result(raw.stdout, raw.stderr, raw.exited)
        if not as_login_user:
            self._require_sudo(result)
        if check and not result.ok:
            # A non-root login denied a write (the workdir, the venv) is the common case
            # where `become: sudo` is what is missing: say so.
            hint = self.root_hint() if "permission denied" in result.stderr.lower() else ""
            advice = f".{hint}" if hint else ""
            raise RemoteCommandError(self.name, command, result.exit_code, result.stderr, advice)
        return result

    def upload(self, data: bytes, remote: str, *, private: bool = False) -> None:
        """Write `data` to the file `remote` (its directory must exist), created 0600 when
        `private`. A failed write (a full disk) leaves no file behind and names the reason."""
        quoted = shlex.quote(remote)
        self.run(f"umask {'077' if private else '022'} && : > {quoted}")
        try:
            if self.through_shell:
                self._write_through_shell(data, quoted)
            else:
                self.connection.put(io.BytesIO(data), remote)
        except (OSError, paramiko.SSHException) as exc:
            self.run(f"rm -f -- {quoted}", check=False)
            free = format_bytes(self.probe(probes.free_bytes(remote)))
            raise HostError(
                self.name,
                f"writing {remote} ({format_bytes(len(data))}) failed: "
                f"{exc or type(exc).__name__}; {free} free there. Free space on {self.name} "
                "and retry.",
            ) from None

    def _write_through_shell(self, data: bytes, quoted: str) -> None:
        """SFTP writes as the login user, on the host: under `become` or into a container,
        the bytes go to `cat` run where the command runs."""
        channel = self.connection.transport.open_session()
        try:
            channel.exec_command(self.login_command(f"cat > {quoted}"))
            channel.sendall(data)
            channel.shutdown_write()
            code = channel.recv_exit_status()
            if code != 0:
                error = channel.makefile_stderr("r").read().decode(errors="replace")
                raise OSError(f"cat exited {code}: {stderr_reason(error)}")
        finally:
            channel.close()

    def download(self, remote: str) -> bytes | None:
        """The bytes of the file `remote`; None when it does not exist. Under `become` or in a
        container they come from `cat` run there (SFTP reads as the login user, on the host)."""
        self.open()
        if not self.through_shell:
            buffer = io.BytesIO()
            try:
                self.connection.get(remote, buffer)
            except FileNotFoundError:
                return None
            return buffer.getvalue()
        quoted = shlex.quote(remote)
        channel = self.connection.transport.open_session()
        try:
            channel.exec_command(self.login_command(f"[ -e {quoted} ] || exit 3; cat {quoted}"))
            data = channel.makefile("rb").read()
            code = channel.recv_exit_status()
            if code == 3:
                return None
            if code != 0:
                error = channel.makefile_stderr("r").read().decode(errors="replace")
                raise OSError(f"reading {remote}: cat exited {code}: {stderr_reason(error)}")
            return data
        finally:
            channel.close()

    def probe(self, probe: Probe[T]) -> T:
        return probe.parse(self.run(probe.command).stdout)

    # --- data plane (OpenSSH) -------------------------------------------------------------

    def ssh_argv(self, command: str) -> list[str]:
        """`ssh … -- command` for bulk transfers: same identity as the Fabric connection,
        batch mode (never prompt), strict host keys, fast ciphers, no compression."""
        self._check_lab()
        argv = ["ssh"]
        if self.inventory.ssh_config:
            config = self.inventory.ssh_config
            argv += ["-F", "/dev/null" if config == "none" else str(Path(config).expanduser())]
        options = {
            "BatchMode": "yes",
            "StrictHostKeyChecking": "yes",
            "UserKnownHostsFile": str(self.known_hosts),
            "ConnectTimeout": str(self.entry.connect_timeout),
            "Compression": "no",
            "Ciphers": FAST_CIPHERS,
            "ServerAliveInterval": str(self.inventory.transfer.keepalive),
            "ServerAliveCountMax": str(KEEPALIVE_COUNT),
            # INFO, not ERROR: "Timeout, server … not responding" is logged at INFO.
            "LogLevel": "INFO",
        }
        if self.entry.identity_file:
            options["IdentityFile"] = str(Path(self.entry.identity_file).expanduser())
            options["IdentitiesOnly"] = "yes"
        for key, value in options.items():
            argv += ["-o", f"{key}={value}"]
        if self.entry.port is not None:
            argv += ["-p", str(self.entry.port)]
        if self.entry.user:
            argv += ["-l", self.entry.user]
        return [*argv, self.entry.address, "--", self.login_command(command)]


def each_eval_host(
    inventory: Inventory, name: str | None = None
) -> Iterator[tuple[Host, EvalHost]]:
    """Every eval host (or only `name`), each closed once the caller moves on."""
    names = [inventory.eval_host(name)[0]] if name else list(inventory.eval_hosts)
    for host_name in names:
        host = Host(inventory, host_name)
        try:
            yield host, inventory.eval_hosts[host_name]
        finally:
            host.close()


def _no_delay(sock: object) -> None:
    """Send small control messages at once: with Nagle's algorithm each request/answer
    waits for the peer's delayed ACK (40 ms a round trip). A ProxyCommand is no socket."""
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _os_reason(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    errors = getattr(exc, "errors", None)  # paramiko's NoValidConnectionsError
    if errors:
        text = "; ".join(sorted({getattr(e, "strerror", None) or str(e) for e in errors.values()}))
    return text.lower()


# What the tool installs for every user of a host (venv, uv, harness): readable by all,
# writable by the owner only.
SHARED_UMASK = "022"


def with_umask(mask: str, command: str) -> str:
    """`command` under an explicit umask, so the modes of what it creates on the host are the
    ones we chose and not whatever the login's umask happens to be."""
    return f"umask {mask}; {command}"
