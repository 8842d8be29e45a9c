"""The byte mover: a file's bytes from one side to another through the workstation.

A transfer starts one process at each end — `ssh SOURCE 'read | hash'` and `ssh DEST 'hash >
NAME.partial'` — and moves the bytes from the first's stdout pipe to the second's stdin pipe
with `os.splice`, so they never enter Python; the loop only counts them for the progress bar.

Both processes can be started *gated*: each waits for a `go` line on its stdin before it
touches anything, so their SSH handshakes overlap the control round trips that decide whether
(and how) to transfer at all; a transfer that turns out not to be needed is cancelled before
it wrote a byte.

On a fresh transfer each end computes SHA-256 in-stream (no second read): the source sends
its digest on stderr, the destination prints the digest of what it wrote on stdout after an
fsync. After its last byte the source also reports the file's size and mtime on stderr, so a
file that changed while it was read is caught without another round trip. A resumed transfer
appends from the partial's size; its verification is a whole-file hash at both ends
afterwards, run in parallel.

With a bandwidth limit (`transfer.bwlimit`, `--bwlimit`) the splice loop is paced by a token
bucket (`Pace`): it asks for no more bytes than the limit allows so far, and the pipes' back
pressure slows the reader on the trainer to the same rate. The copy stays a plain stream, so an
interrupted paced copy resumes like any other.

Reading a plain file, the source hashes each chunk from a copy (`pread`) and hands the page
cache itself to the pipe with `sendfile`: one copy less than read + write, which shows on a
CPU-bound host. Bytes that changed between the two are caught by the destination's digest.

The hashing prefers `python3` (hashlib uses OpenSSL's SHA-NI code: several times faster than
coreutils' sha256sum, which matters when ssh already keeps the CPUs busy), then `openssl`,
then `sha256sum`; each command picks the first one its host has when it runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from dflash_ops.remote import messages, priority, probes
from dflash_ops.staging.pace import Pace, Paced

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
import hashlib, os, stat, sys
h = hashlib.sha256()
try:
    if stat.S_ISREG(os.fstat(0).st_mode):
        done = 0
        while True:
            b = os.pread(0, 1 << 20, done)
            if not b:
                break
            h.update(b)
            end = done + len(b)
            while done < end:
                sent = os.sendfile(1, 0, done, end - done)
                if not sent:
                    sys.stderr.write("dflash-relay: sending: the file shrank while read\\n")
                    sys.exit(1)
                done += sent
    else:
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
# Nothing on stdin for argv[4] seconds: the stream is gone (a dead link need not end sshd's
# session for a long time), so give up and close the file rather than hold it open.
PY_SINK = (
    PY_PIPE
    + """\
import hashlib, os, select, sys
path, append, hashed = sys.argv[1], sys.argv[2] == "append", sys.argv[3] == "hash"
stall = float(sys.argv[4]) or None  # 0: no limit
h = hashlib.sha256()
flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
try:
    fd = os.open(path, flags, 0o644)
    while True:
        if not select.select([0], [], [], stall)[0]:
            os.fsync(fd)  # what arrived stays, for a resume
            sys.stderr.write("dflash-relay: writing %s: nothing for %g s\\n" % (path, stall))
            sys.exit(3)
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


STAT_MARK = "dflash-stat"
NO_HASHER = "dflash-relay: none of python3, openssl, sha256sum found; install coreutils"
HASHER_PROBE = (
    "for t in python3 openssl sha256sum; do command -v $t >/dev/null && { echo $t; break; }; done"
)


def _py(script: str, *args: str) -> str:
    # -I: no PYTHONPATH or user site can shadow hashlib; -S: no site import (faster start).
    return " ".join(["python3", "-I", "-S", "-c", shlex.quote(script), *map(shlex.quote, args)])


def _by_hasher(python: str, other: Callable[[str], str]) -> str:
    """A command that runs `python` where python3 exists, else `other(tool)` with the first
    of openssl/sha256sum the host has (the tool is a command printing stdin's digest)."""
    tools = {"openssl": "openssl dgst -sha256 -r", "sha256sum": "sha256sum"}
    branches = "".join(f"{name}) {other(tool)};; " for name, tool in tools.items())
    return (
        f'case "$({HASHER_PROBE})" in python3) {python};; {branches}'
        f"*) echo {shlex.quote(NO_HASHER)} >&2; exit 127;; esac"
    )


# --- the commands at each end ---------------------------------------------------------------


def hash_stdin() -> str:
    """A command that prints the SHA-256 of its stdin."""
    return _by_hasher(_py(PY_HASH), lambda tool: tool)


def hash_file(path: str) -> str:
    return f"{{ {hash_stdin()}; }} < {shlex.quote(path)}"


def stream_hashed(read_command: str, path: str | None = None) -> str:
    """`read_command`'s bytes to stdout, their digest on stderr after SOURCE_MARK.
    With `path` (a plain file on this side) python reads the file itself: one pipe less."""
    python = (
        f"{_py(PY_SOURCE)} < {shlex.quote(path)}"
        if path is not None
        else f"{{ {read_command}; }} | {_py(PY_SOURCE)}"
    )
    return _by_hasher(
        python,
        lambda tool: (
            f"{{ {{ {read_command}; }} | tee /dev/fd/3 | {tool} | "
            f"sed 's/^/{SOURCE_MARK} /' >&2; }} 3>&1"
        ),
    )


def source_command(read_command: str, stat_command: str, *, hashed: bool, path: str | None) -> str:
    """The source end: the bytes (hashed in-stream when `hashed`), then the file's stat on
    stderr after STAT_MARK (`stat_command` prints 'size mtime kind' or 'missing')."""
    stream = stream_hashed(read_command, path) if hashed else f"{{ {read_command}; }}"
    return (
        f"set -o pipefail; {stream}; rc=$?; "
        f"{{ {stat_command}; }} 2>/dev/null | sed 's/^/{STAT_MARK} /' >&2; exit $rc"
    )


def sink(path: str, *, append: bool, hashed: bool, stall_timeout: float | None) -> str:
    """Write stdin to `path`, fsync; print the digest of the bytes written if `hashed`. Either
    writer (python3, else tee) exits with status 3, closing the file and keeping what arrived,
    when nothing arrives for `stall_timeout` seconds."""
    quoted = shlex.quote(path)
    mode, digest = "append" if append else "create", "hash" if hashed else "-"
    python = _py(PY_SINK, path, mode, digest, str(stall_timeout or 0))
    tee = f"tee --output-error=exit {'-a ' if append else ''}-- {quoted}"
    writer = _watched(tee, path, stall_timeout) if stall_timeout else tee

    def other(tool: str) -> str:
        # Grouped, so that pipefail sees the writer's status when nothing is hashed too.
        digest = tool if hashed else "{ cat >/dev/null; echo unhashed; }"
        return f"{{ {writer} | {digest} && sync -- {quoted}; }}"

    return f"set -o pipefail; {_by_hasher(python, other)}"


def _watched(tee: str, path: str, stall_timeout: float) -> str:
    """`tee` (writing `path`) with a watchdog: python3's select timeout, in shell. tee runs in
    the background on the group's stdin (fd 3: a background job's own stdin is /dev/null);
    the watchdog looks at the file's size every second and sends tee SIGUSR1 once it has not
    grown for `stall_timeout` seconds. The watchdog keeps none of the pipes open, so the
    digest and the session end as soon as tee does."""
    quoted = shlex.quote(path)
    seconds = max(1, math.ceil(stall_timeout))
    said = shlex.quote(f"dflash-relay: writing {path}: nothing for {stall_timeout:g} s")
    watchdog = (
        "( n=0; last=; while sleep 1; do "
        f"size=$(stat -c %s -- {quoted} 2>/dev/null); "
        'if [ "$size" = "$last" ]; then n=$((n + 1)); else n=0; last=$size; fi; '
        f'[ "$n" -lt {seconds} ] || {{ kill -s USR1 "$tee"; exit 0; }}; '
        "done ) </dev/null >/dev/null 2>&1 3<&- 4>&- &"
    )
    # The shell's own stderr (fd 2) goes nowhere: it would report tee's SIGUSR1 death.
    return (
        f"{{ exec 3<&0 4>&2 2>/dev/null; {tee} <&3 2>&4 3<&- 4>&- & tee=$!; "
        f'{watchdog} watchdog=$!; wait "$tee"; rc=$?; kill "$watchdog"; '
        f'if [ "$(kill -l "$rc")" = USR1 ]; then sync -- {quoted}; '
        f"echo {said} >&4; exit 3; fi; exit $rc; }}"
    )


def gated(command: str) -> str:
    """`command`, once a `go` line arrives on stdin; anything else (EOF) ends it untouched."""
    return f'IFS= read -r gate && [ "$gate" = go ] || exit 0; {command}'


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
    source_rc: int | None
    source_err: str
    dest_rc: int | None
    dest_out: str
    dest_err: str
    paced: Paced | None = None  # how a bandwidth limit held the stream back (None: no limit)

    def _marked(self, mark: str) -> str | None:
        for line in reversed(self.source_err.splitlines()):
            if line.startswith(f"{mark} "):
                return line.removeprefix(f"{mark} ")
        return None

    @property
    def source_digest(self) -> str | None:
        return digest_in(self._marked(SOURCE_MARK) or "")

    @property
    def source_stat(self) -> probes.FileStat | None:
        """The source file's size/mtime right after it was read (None: gone, or unknown)."""
        line = self._marked(STAT_MARK)
        try:
            return probes.parse_file_stat(line) if line else None
        except probes.ProbeParseError:
            return None

    @property
    def dest_digest(self) -> str | None:
        return digest_in(self.dest_out)

    @property
    def priorities(self) -> list[str]:
        """What the source's readers said they ran at ('trainer: nice 19, ionice idle')."""
        return priority.announced(self.source_err)


def digest_in(text: str) -> str | None:
    """The last sha256 hex digest a hashing command printed (None: it printed none)."""
    found = DIGEST.findall(text)
    return found[-1] if found else None


ProgressCallback = Callable[[RelayState], None]


class Pipe:
    """A source process and a destination process, started at once; `run` splices one into
    the other, at most `bwlimit` bytes per second when given. Gated (`gated=True`): both wait
    for `open_gate()` (or exit on `cancel()`)."""

    def __init__(
        self,
        source_argv: list[str],
        dest_argv: list[str],
        *,
        gated: bool,
        bwlimit: int | None = None,
    ) -> None:
        self.gated = gated
        self.bwlimit = bwlimit
        # The processes' stderr/stdout: files that live as long as the Pipe does.
        self._files = contextlib.ExitStack()
        self.source_err, self.dest_out, self.dest_err = (
            self._files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
            for _ in range(3)
        )
        # Own process groups: a terminal's Ctrl-C reaches only us, and we stop them in order.
        self.source = subprocess.Popen(
            source_argv,
            stdin=subprocess.PIPE if gated else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.source_err,
            process_group=0,
        )
        self.dest = subprocess.Popen(
            dest_argv,
            stdin=subprocess.PIPE,
            stdout=self.dest_out,
            stderr=self.dest_err,
            process_group=0,
        )

    def open_gate(self) -> None:
        if not self.gated:
            return
        with contextlib.suppress(BrokenPipeError):  # one ended already: `run` says why
            self.source.stdin.write(b"go\n")
            self.source.stdin.close()
        with contextlib.suppress(BrokenPipeError):
            self.dest.stdin.write(b"go\n")
            self.dest.stdin.flush()
        self.gated = False

    def cancel(self) -> None:
        """Stop both before they wrote anything (gated) or whatever they were doing."""
        if not self.gated and self.source.poll() is not None and self.dest.poll() is not None:
            return
        for proc in (self.source, self.dest):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for stream in (self.source.stdin, self.source.stdout, self.dest.stdin):
            if stream is not None:
                with contextlib.suppress(BrokenPipeError):
                    stream.close()
        _wait(self.source, 5)
        _wait(self.dest, 5)
        self._files.close()
        self.gated = False  # nothing waits at the gate any more: a second cancel is a no-op

    def run(self, total: int, on_progress: ProgressCallback | None = None) -> Moved:
        """Splice the source's stdout into the destination's stdin until the source ends.
        On any interruption (Ctrl-C included) the source is stopped and the destination is
        left to write and fsync what it has received, so the partial keeps every byte that
        arrived."""
        self.open_gate()
        source, dest = self.source, self.dest
        count = 0
        try:
            src_fd, dst_fd = source.stdout.fileno(), dest.stdin.fileno()
            for fd in (src_fd, dst_fd):
                # Over /proc/sys/fs/pipe-max-size for this user: keep the default size.
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
            state = RelayState(0, total, source, dest)
            pace = Pace(self.bwlimit) if self.bwlimit else None
            while True:
                try:
                    n = os.splice(src_fd, dst_fd, pace.allowance() if pace else CHUNK)
                except BrokenPipeError:
                    break  # the destination ended (disk full, killed): its status says why
                if n == 0:
                    break
                if pace is not None:
                    pace.spent(n)
                count += n
                if on_progress is not None:
                    state.done = count
                    on_progress(state)
        except BaseException:
            self._stop()
            raise
        source.stdout.close()
        _close_quietly(dest)
        source_rc = _wait(source, 30)
        dest_rc = _wait(dest, 120)
        with self._files:
            return Moved(
                count,
                source_rc,
                _text(self.source_err),
                dest_rc,
                _text(self.dest_out),
                _text(self.dest_err),
                pace.report() if pace else None,
            )

    def _stop(self) -> None:
        """Interrupted: kill the reader, let the writer finish what it got, then make sure."""
        if self.source.poll() is None:
            os.killpg(self.source.pid, signal.SIGTERM)
        self.source.stdout.close()
        _close_quietly(self.dest)
        if _wait(self.dest, 15) is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.dest.pid, signal.SIGTERM)
        _wait(self.source, 5)
        self._files.close()


def move(
    source_argv: list[str],
    dest_argv: list[str],
    total: int,
    on_progress: ProgressCallback | None = None,
    bwlimit: int | None = None,
) -> Moved:
    """Start both processes and move the bytes (see `Pipe.run`)."""
    return Pipe(source_argv, dest_argv, gated=False, bwlimit=bwlimit).run(total, on_progress)


def _text(file) -> str:
    file.seek(0)
    return file.read().decode(errors="replace")


def _close_quietly(dest: subprocess.Popen) -> None:
    with contextlib.suppress(BrokenPipeError):
        dest.stdin.close()


def _wait(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def stderr_reason(text: str) -> str:
    """Why a side failed: its last stderr line that is not one of the stream's own marks."""
    marks = (STAT_MARK, priority.MARK)
    text = "\n".join(line for line in text.splitlines() if not line.startswith(marks))
    return messages.stderr_reason(text, skip_prefix=SOURCE_MARK)
