"""The byte mover: a file's bytes from one side to another through the workstation.

A *side* is where commands run: a remote host (OpenSSH for bulk bytes, Fabric for small
commands) or the workstation itself. A transfer starts one process at each end — `ssh SOURCE
'read | hash'` and `ssh DEST 'hash > NAME.partial'` — and moves the bytes from the first's
stdout pipe to the second's stdin pipe with `os.splice`, so they never enter Python; the loop
only counts them for the progress bar.

On a fresh transfer each end computes SHA-256 in-stream (no second read): the source sends
its digest on stderr, the destination prints the digest of what it wrote on stdout after an
fsync. A resumed transfer appends from the partial's size; its verification is a whole-file
hash at both ends afterwards (`hash_file`), run in parallel.

The end-of-stream hashing prefers `python3` (hashlib uses OpenSSL's SHA-NI code: several
times faster than coreutils' sha256sum, which matters when ssh already keeps the CPUs busy),
then `openssl`, then `sha256sum`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from dflash_ops.core.errors import TransferError
from dflash_ops.remote import connection, probes
from dflash_ops.remote.connection import Host, Result

CHUNK = 1 << 20
PIPE_SIZE = 1 << 20
DIGEST = re.compile(r"\b([0-9a-f]{64})\b")
SOURCE_MARK = "dflash-sha256"

# Copy stdin to stdout, hashing on the way; the digest goes to stderr (the side channel).
PY_PIPE = """\
import fcntl
try:
    fcntl.fcntl(0, 1031, 1 << 20)  # F_SETPIPE_SZ: fewer, larger reads (fails on a file: fine)
except OSError:
    pass
"""

PY_SOURCE = (
    PY_PIPE
    + """\
import hashlib, os, sys
h = hashlib.sha256()
try:
    while True:
        b = os.read(0, 1 << 20)
        if not b:
            break
        h.update(b)
        v = memoryview(b)
        while v:
            v = v[os.write(1, v):]
except OSError as e:
    sys.stderr.write("dflash-relay: sending: %s\\n" % e.strerror)
    sys.exit(1)
sys.stderr.write("dflash-sha256 %s\\n" % h.hexdigest())
"""
)

# Write stdin to argv[1] (truncate or append), fsync, print the digest of what was written.
PY_SINK = (
    PY_PIPE
    + """\
import hashlib, os, sys
path, append, hashed = sys.argv[1], sys.argv[2] == "append", sys.argv[3] == "hash"
h = hashlib.sha256()
flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
try:
    fd = os.open(path, flags, 0o644)
    while True:
        b = os.read(0, 1 << 20)
        if not b:
            break
        if hashed:
            h.update(b)
        v = memoryview(b)
        while v:
            v = v[os.write(fd, v):]
    os.fsync(fd)
except OSError as e:
    sys.stderr.write("dflash-relay: writing %s: %s\\n" % (path, e.strerror))
    sys.exit(1)
print(h.hexdigest() if hashed else "unhashed")
"""
)

PY_HASH = (
    PY_PIPE
    + """\
import hashlib, os
h = hashlib.sha256()
while True:
    b = os.read(0, 1 << 20)
    if not b:
        break
    h.update(b)
print(h.hexdigest())
"""
)


HASHER_PROBE = (
    "for t in python3 openssl sha256sum; do command -v $t >/dev/null && { echo $t; break; }; done"
)


def _py(script: str, *args: str) -> str:
    return " ".join(["python3", "-c", shlex.quote(script), *map(shlex.quote, args)])


# --- sides --------------------------------------------------------------------------------


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

    @cached_property
    def hasher(self) -> str:
        """The SHA-256 tool this side has: python3, openssl or sha256sum."""
        return self.set_hasher(self.run(HASHER_PROBE).stdout)

    def set_hasher(self, probe_output: str) -> str:
        """Record HASHER_PROBE's answer (it can ride along with another command)."""
        found = probe_output.split()
        if not found:
            raise TransferError(
                f"{self.name}: none of python3, openssl, sha256sum found; install coreutils"
            )
        self.__dict__["hasher"] = found[0]
        return found[0]

    def hash_stdin(self) -> str:
        """A command that prints the SHA-256 of its stdin."""
        return {
            "python3": _py(PY_HASH),
            "openssl": "openssl dgst -sha256 -r",
            "sha256sum": "sha256sum",
        }[self.hasher]

    def stream_hashed(self, read_command: str, path: str | None = None) -> str:
        """`read_command`'s bytes to stdout, their digest on stderr after SOURCE_MARK.
        With `path` (a plain file on this side) python reads the file itself: one pipe less."""
        if self.hasher == "python3":
            if path is not None:
                return f"{_py(PY_SOURCE)} < {shlex.quote(path)}"
            return f"set -o pipefail; {read_command} | {_py(PY_SOURCE)}"
        return (
            f"set -o pipefail; {{ {read_command} | tee /dev/fd/3 | {self.hash_stdin()} | "
            f"sed 's/^/{SOURCE_MARK} /' >&2; }} 3>&1"
        )

    def sink(self, path: str, *, append: bool, hashed: bool) -> str:
        """Write stdin to `path`, fsync; print the digest of the bytes written if `hashed`."""
        if self.hasher == "python3":
            return _py(PY_SINK, path, "append" if append else "create", "hash" if hashed else "-")
        quoted = shlex.quote(path)
        tee = f"tee --output-error=exit {'-a ' if append else ''}-- {quoted}"
        digest = self.hash_stdin() if hashed else "cat >/dev/null; echo unhashed"
        return f"set -o pipefail; {tee} | {digest} && sync -- {quoted}"


class RemoteSide(Side):
    def __init__(self, host: Host) -> None:
        self.host = host
        self.name = host.name

    def argv(self, command: str) -> list[str]:
        return self.host.ssh_argv(f"bash -c {shlex.quote(command)}")

    def run(self, command: str, *, check: bool = True) -> Result:
        return self.host.run(f"bash -c {shlex.quote(command)}", check=check)

    def hold(self, command: str) -> HeldCommand:
        # A channel on the already-open control connection: no second SSH handshake. If the
        # workstation dies, the connection and the command's stdin go with it.
        self.host.open()
        return ChannelCommand(
            self.host.connection.transport,
            f"bash -c {shlex.quote(command)}",
            self.host.keepalive_window,
        )


class LocalSide(Side):
    """The workstation (two-hop staging)."""

    name = "workstation"

    def argv(self, command: str) -> list[str]:
        return ["bash", "-c", command]

    def run(self, command: str, *, check: bool = True) -> Result:
        done = subprocess.run(self.argv(command), capture_output=True, text=True)
        result = Result(done.stdout, done.stderr, done.returncode)
        if check and not result.ok:
            from dflash_ops.core.errors import RemoteCommandError

            raise RemoteCommandError(self.name, command, done.returncode, done.stderr)
        return result


# --- long-lived commands (locks) -----------------------------------------------------------


class HeldCommand:
    def readline(self) -> str:
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

    def errors(self) -> str:
        return self.process.stderr.read()

    def close(self) -> None:
        _close_quietly(self.process)
        _wait(self.process, 10)


class ChannelCommand(HeldCommand):
    def __init__(self, transport, command: str, close_timeout: float) -> None:
        self.close_timeout = close_timeout
        self.channel = transport.open_session()
        self.channel.exec_command(command)
        self.stdout = self.channel.makefile("r")

    def readline(self) -> str:
        return self.stdout.readline()

    def errors(self) -> str:
        return self.channel.makefile_stderr("r").read().decode(errors="replace")

    def close(self) -> None:
        """EOF on the command's stdin: it exits and its lock goes. Bounded: over a dead link
        the exit status never comes back, and waiting for it must not hang the task."""
        with contextlib.suppress(OSError, EOFError):
            self.channel.shutdown_write()
        self.channel.status_event.wait(self.close_timeout)
        self.channel.close()


# --- moving bytes -------------------------------------------------------------------------


@dataclass
class RelayState:
    """What a progress callback sees; `source`/`destination` are the ssh processes."""

    done: int
    total: int
    source: subprocess.Popen
    destination: subprocess.Popen


@dataclass(frozen=True)
class Moved:
    count: int
    source_rc: int
    source_err: str
    dest_rc: int
    dest_out: str
    dest_err: str

    @property
    def source_digest(self) -> str | None:
        for line in reversed(self.source_err.splitlines()):
            if line.startswith(SOURCE_MARK):
                return line.split()[1]
        return None

    @property
    def dest_digest(self) -> str | None:
        return digest_in(self.dest_out)


def digest_in(text: str) -> str | None:
    """The last sha256 hex digest a hashing command printed (None: it printed none)."""
    found = DIGEST.findall(text)
    return found[-1] if found else None


ProgressCallback = Callable[[RelayState], None]


def move(
    source_argv: list[str],
    dest_argv: list[str],
    total: int,
    on_progress: ProgressCallback | None = None,
) -> Moved:
    """Run both processes and splice the source's stdout into the destination's stdin until
    the source ends. On any interruption (Ctrl-C included) the source is stopped and the
    destination is left to write and fsync what it has received, so the partial keeps every
    byte that arrived."""
    with (
        tempfile.TemporaryFile() as source_err,
        tempfile.TemporaryFile() as dest_out,
        tempfile.TemporaryFile() as dest_err,
    ):
        # Own process groups: a terminal's Ctrl-C reaches only us, and we stop them in order.
        source = subprocess.Popen(
            source_argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=source_err,
            process_group=0,
        )
        dest = subprocess.Popen(
            dest_argv, stdin=subprocess.PIPE, stdout=dest_out, stderr=dest_err, process_group=0
        )
        count = 0
        try:
            src_fd, dst_fd = source.stdout.fileno(), dest.stdin.fileno()
            for fd in (src_fd, dst_fd):
                # Over /proc/sys/fs/pipe-max-size for this user: keep the default size.
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
            state = RelayState(0, total, source, dest)
            while True:
                try:
                    n = os.splice(src_fd, dst_fd, CHUNK)
                except BrokenPipeError:
                    break  # the destination ended (disk full, killed): its status says why
                if n == 0:
                    break
                count += n
                if on_progress is not None:
                    state.done = count
                    on_progress(state)
        except BaseException:
            _stop(source, dest)
            raise
        source.stdout.close()
        _close_quietly(dest)
        source_rc = _wait(source, 30)
        dest_rc = _wait(dest, 120)

        def text(f) -> str:
            f.seek(0)
            return f.read().decode(errors="replace")

        return Moved(count, source_rc, text(source_err), dest_rc, text(dest_out), text(dest_err))


def _close_quietly(dest: subprocess.Popen) -> None:
    with contextlib.suppress(BrokenPipeError):
        dest.stdin.close()


def _stop(source: subprocess.Popen, dest: subprocess.Popen) -> None:
    """Interrupted: kill the reader, let the writer finish what it got, then make sure."""
    for proc in (source,):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    source.stdout.close()
    _close_quietly(dest)
    if _wait(dest, 15) is None:
        os.killpg(dest.pid, signal.SIGTERM)
    _wait(source, 5)


def _wait(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def stderr_reason(text: str) -> str:
    """Why a side failed: its last stderr line that is not the source's digest."""
    return connection.stderr_reason(text, skip_prefix=SOURCE_MARK)
