"""One stage at a time per destination file: an exclusive `flock` held by a process there.

The lock belongs to a long-lived command on the destination side (`flock` on fd 9, then
`cat` until its stdin closes). When the workstation dies or the connection drops cleanly,
that session ends and the lock goes with it. Over a dead link it does not: the remote
command lives on until the host notices, minutes later. So the lock file names its holder
(pid, host, a token per acquisition), and a holder that is gone — a dead process of this
workstation, or this very process after it gave that lock up — is taken over at once: the
processes still holding the lock file or the partial open are stopped, then the lock is
taken, with a note saying so.

While it holds the lock, that command also runs the commands the stage sends it (`run`):
reading the destination's state, finishing a file, promoting — each a line on its stdin and an
answer on its stdout, without a new SSH session or Fabric's per-command overhead.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import socket
import time
from base64 import b64encode
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dflash_ops.core.errors import TransferError
from dflash_ops.remote.connection import Result
from dflash_ops.staging.relay_commands import stderr_reason
from dflash_ops.staging.sides import HeldCommand, Side

TAKEOVER_WAIT_S = 10  # how long the new holder waits for the stopped one to let go

_HELD: set[str] = set()  # tokens of the locks this process holds right now


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    since: str
    token: str

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host} since {self.since}"

    def line(self) -> str:
        return f"{self} token {self.token}"

    @classmethod
    def new(cls) -> Holder:
        return cls(
            os.getpid(), socket.gethostname(), time.strftime("%H:%M:%S"), secrets.token_hex(6)
        )

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        found = re.fullmatch(r"pid (\d+) on (\S+) since (\S+) token (\w+)", text.strip())
        return cls(int(found[1]), found[2], found[3], found[4]) if found else None

    def gone(self) -> bool:
        """Whether this holder certainly no longer runs: a process of this workstation that
        has exited, or this process holding a token it already gave up."""
        if self.host != socket.gethostname():
            return False
        if self.pid == os.getpid():
            return self.token not in _HELD
        return not _process_alive(self.pid)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # PID 1 may not reap: a zombie has exited
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True


def glob_literal(path: str) -> str:
    """`path` as a find(1) -lname pattern that matches only itself."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", path)


class DestinationLock:
    """`with DestinationLock(side, lock_path, held_open) as lock:` around one stage of a file
    or a set; `held_open` are find(1) -lname patterns of what a gone holder's processes may
    still have open (its partials), `lock.run(command)` runs a command under the lock."""

    def __init__(
        self,
        side: Side,
        path: str,
        held_open: Sequence[str],
        note: Callable[[str], None] = print,
        first: str | None = None,
    ) -> None:
        self.side, self.path, self.note = side, path, note
        self.held_open = (glob_literal(path), *held_open)
        self.holder = Holder.new()
        self.session: HeldCommand | None = None
        self.done_mark = f"@@dflash-done-{self.holder.token}"
        self.first = first  # run as soon as the lock is taken: no round trip of its own
        self.first_result: Result | None = None

    def acquire(self) -> None:
        answer = self._try(wait=0)
        if answer.startswith("BUSY"):
            holder = Holder.parse(answer.removeprefix("BUSY"))
            if holder is not None and holder.gone():
                self._stop_leftovers()
                self.note(
                    f"{self.side.name}: took over the lock {self.path} from {holder}, which "
                    "is gone (its remote commands outlived a dropped connection)"
                )
                answer = self._try(wait=TAKEOVER_WAIT_S)
        if answer == "LOCKED":
            _HELD.add(self.holder.token)
            if self.first is not None:
                self.first_result = self._answer()
            return
        if answer.startswith("BUSY"):
            holder = answer.removeprefix("BUSY").strip() or "unknown"
            raise TransferError(
                f"{self.side.name}: {self.path} is locked by another stage of the same file "
                f"({holder}). Wait for it to finish (the lock is released when it ends), "
                f"then rerun."
            )
        raise TransferError(f"{self.side.name}: could not take the lock {self.path}: {answer}")

    def _try(self, wait: int) -> str:
        """'LOCKED' (and the session holds it), 'BUSY <holder line>', or the error."""
        quoted = shlex.quote(self.path)
        flock = f"flock -w {wait} 9" if wait else "flock -n 9"
        command = (
            f'mkdir -p -- "$(dirname -- {quoted})" && (umask 077 && : >> {quoted}) && '
            f"exec 9>>{quoted} && "
            f"if {flock}; then printf '%s\\n' {shlex.quote(self.holder.line())} > {quoted}; "
            f"echo LOCKED; {self._first()}{self._serve()}; "
            f'else echo "BUSY $(cat -- {quoted})"; fi'
        )
        self.session = self.side.hold(command)
        answer = self.session.readline().strip()
        if answer == "LOCKED":
            return answer
        errors = self.session.errors() if not answer else ""
        self.release()
        return answer or stderr_reason(errors)

    def _first(self) -> str:
        if self.first is None:
            return ""
        return f"( {self.first}\n) </dev/null 2>&1; printf '\\n{self.done_mark} %s\\n' $?; "

    def _serve(self) -> str:
        """The loop that runs, while the lock is held, each command sent as a base64 line
        (commands may span lines), in a subshell (fd 9, the lock, stays open), and ends each
        answer with the done mark and the exit status. EOF ends it, and the lock goes."""
        return (
            "while IFS= read -r line; do "
            '( eval "$(printf %s "$line" | base64 -d)" ) </dev/null 2>&1; '
            f"printf '\\n{self.done_mark} %s\\n' $?; done"
        )

    def run(self, command: str) -> Result:
        """Run `command` on the destination side under the lock: its output (stdout and
        stderr together) and exit status."""
        if self.session is None:
            raise TransferError(f"{self.side.name}: {self.path} is not locked by this stage")
        self.session.write(b64encode(command.encode()).decode() + "\n")
        return self._answer()

    def _answer(self) -> Result:
        """Read a command's output up to the done mark."""
        lines: list[str] = []
        while True:
            line = self.session.readline()
            if not line:
                raise TransferError(
                    f"{self.side.name}: the session holding {self.path} ended while running "
                    f"a command (connection lost?): {stderr_reason(''.join(lines))}"
                )
            if line.startswith(f"{self.done_mark} "):
                output = "".join(lines)
                return Result(output.removesuffix("\n"), output, int(line.split()[1]))
            lines.append(line)

    def _stop_leftovers(self) -> None:
        """Stop whatever still has the lock file or a partial open (the old holder's session
        and the old transfer's writer), found through /proc: nothing else is touched."""
        matches = " -o ".join(f"-lname {shlex.quote(p)}" for p in self.held_open)
        self.side.run(
            f"find /proc/[0-9]*/fd -maxdepth 1 \\( {matches} \\) "
            "2>/dev/null | cut -d/ -f3 | sort -u | xargs -r kill -TERM 2>/dev/null; true",
            check=False,
        )

    def release(self) -> None:
        _HELD.discard(self.holder.token)
        if self.session is not None:
            self.session.close()
            self.session = None

    def __enter__(self) -> DestinationLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
