"""Where staging commands run: a remote host or the workstation itself (a *side*).

A side runs small commands (Fabric on a remote host, a local bash on the workstation), builds
the argv of a long-running OpenSSH/bash process for bulk bytes, and starts *held* commands:
long-lived commands whose stdin stays open (a destination lock and the commands run while it
is held).
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess

from dflash_ops.core.errors import RemoteCommandError
from dflash_ops.remote import probes
from dflash_ops.remote.connection import SHARED_UMASK, Host, Result, with_umask


def bash(command: str) -> list[str]:
    """bash -c COMMAND under the tool's own umask, set inside that bash: a bash started over
    ssh reads the login's ~/.bashrc (which may set any umask) before running its command."""
    return ["bash", "-c", with_umask(SHARED_UMASK, command)]


class Side:
    """Where commands run. Every command is given to bash (for pipefail), quoted once."""

    name: str

    def argv(self, command: str) -> list[str]:
        raise NotImplementedError

    def run(self, command: str, *, check: bool = True) -> Result:
        raise NotImplementedError

    def free_bytes(self, path: str) -> int:
        return probes.parse_df_avail(self.run(probes.free_bytes(path).command).stdout)

    def hold(self, command: str) -> HeldCommand:
        """Start a long-lived command whose stdin stays open until `close()`."""
        return ProcessCommand(self.argv(command))

    @property
    def stall_timeout(self) -> float | None:
        """Seconds a writer on this side waits for bytes before it gives up
        (transfer.stall_timeout); None: the workstation's own writers, which end with the
        relay that feeds them."""
        return None

    def root_hint(self) -> str:
        """For a denied write: what to do when this side's login is not root ('' if it is)."""
        return ""


class RemoteSide(Side):
    def __init__(self, host: Host) -> None:
        self.host = host
        self.name = host.name

    def argv(self, command: str) -> list[str]:
        return self.host.ssh_argv(shlex.join(bash(command)))

    def run(self, command: str, *, check: bool = True) -> Result:
        return self.host.run(shlex.join(bash(command)), check=check)

    def root_hint(self) -> str:
        return self.host.root_hint()

    @property
    def stall_timeout(self) -> float:
        return self.host.inventory.transfer.stall_timeout

    def hold(self, command: str) -> HeldCommand:
        # A channel on the already-open control connection: no second SSH handshake. If the
        # workstation dies, the connection and the command's stdin go with it.
        self.host.open()
        return ChannelCommand(
            self.host.connection.transport,
            self.host.login_command(shlex.join(bash(command))),
            self.host.keepalive_window,
        )


class LocalSide(Side):
    """The workstation (two-hop staging)."""

    name = "workstation"

    def argv(self, command: str) -> list[str]:
        return bash(command)

    def run(self, command: str, *, check: bool = True) -> Result:
        done = subprocess.run(self.argv(command), capture_output=True, text=True)
        result = Result(done.stdout, done.stderr, done.returncode)
        if check and not result.ok:
            raise RemoteCommandError(self.name, command, done.returncode, done.stderr)
        return result


# --- long-lived commands (locks) -----------------------------------------------------------


class HeldCommand:
    def readline(self) -> str:
        raise NotImplementedError

    def write(self, text: str) -> None:
        raise NotImplementedError

    def errors(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ProcessCommand(HeldCommand):
    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            process_group=0,
        )

    def readline(self) -> str:
        return self.process.stdout.readline()

    def write(self, text: str) -> None:
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def errors(self) -> str:
        return self.process.stderr.read()

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ChannelCommand(HeldCommand):
    def __init__(self, transport, command: str, close_timeout: float) -> None:
        self.close_timeout = close_timeout
        self.channel = transport.open_session()
        self.channel.exec_command(command)
        self.stdout = self.channel.makefile("r")

    def readline(self) -> str:
        return self.stdout.readline()

    def write(self, text: str) -> None:
        self.channel.sendall(text.encode())

    def errors(self) -> str:
        return self.channel.makefile_stderr("r").read().decode(errors="replace")

    def close(self) -> None:
        """EOF on the command's stdin: it exits and its lock goes. Bounded: over a dead link
        the exit status never comes back, and waiting for it must not hang the task."""
        with contextlib.suppress(OSError, EOFError):
            self.channel.shutdown_write()
        self.channel.status_event.wait(self.close_timeout)
        self.channel.close()
