"""The byte mover: a file's bytes from one side to another through the workstation.

A transfer starts one process at each end — `ssh SOURCE 'read | hash'` and `ssh DEST 'hash >
NAME.partial'`, the commands of `relay_commands` — and moves the bytes from the first's stdout
pipe to the second's stdin pipe with `os.splice`, so they never enter Python; the loop only
counts them for the progress bar. What the ends printed (the digests, the source's stat) is
kept in `Moved`.

Both processes can be started *gated*: each waits for a `go` line on its stdin before it
touches anything, so their SSH handshakes overlap the control round trips that decide whether
(and how) to transfer at all; a transfer that turns out not to be needed is cancelled before
it wrote a byte.

With a bandwidth limit (`transfer.bwlimit`, `--bwlimit`) the splice loop is paced by a token
bucket (`Pace`): it asks for no more bytes than the limit allows so far, and the pipes' back
pressure slows the reader on the trainer to the same rate. The copy stays a plain stream, so an
interrupted paced copy resumes like any other.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from dflash_ops.remote import priority, probes
from dflash_ops.staging.pace import Pace, Paced
from dflash_ops.staging.relay_commands import SOURCE_MARK, STAT_MARK, digest_in

CHUNK = 1 << 20
PIPE_SIZE = 1 << 20


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
