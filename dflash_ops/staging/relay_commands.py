"""The relay's commands at each end, and how their answers are read.

The source end reads a file and writes its bytes to stdout (`source_command`); on a fresh
transfer it hashes them in-stream and sends the SHA-256 on stderr after SOURCE_MARK, then the
file's size and mtime after STAT_MARK, so a file that changed while it was read is caught
without another round trip. The destination end (`sink`) writes stdin to the partial, fsyncs
and prints the digest of what it wrote. A resumed transfer is verified afterwards by a
whole-file hash at both ends (`hash_file`). Either end can be `gated`: it waits for a `go`
line on its stdin before it touches anything.

Reading a plain file, the source hashes each chunk from a copy (`pread`) and hands the page
cache itself to the pipe with `sendfile`: one copy less than read + write, which shows on a
CPU-bound host. Bytes that changed between the two are caught by the destination's digest.

The hashing prefers `python3` (hashlib uses OpenSSL's SHA-NI code: several times faster than
coreutils' sha256sum, which matters when ssh already keeps the CPUs busy), then `openssl`,
then `sha256sum`; each command picks the first one its host has when it runs.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable

from dflash_ops.remote import messages, priority

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


# --- reading their answers ----------------------------------------------------------------


def digest_in(text: str) -> str | None:
    """The last sha256 hex digest a hashing command printed (None: it printed none)."""
    found = DIGEST.findall(text)
    return found[-1] if found else None


def stderr_reason(text: str) -> str:
    """Why a side failed: its last stderr line that is not one of the stream's own marks."""
    marks = (STAT_MARK, priority.MARK)
    text = "\n".join(line for line in text.splitlines() if not line.startswith(marks))
    return messages.stderr_reason(text, skip_prefix=SOURCE_MARK)
