"""Gentle to training: the commands that read the trainer's disk run at the lowest CPU
priority (`nice -n 19`) and in the idle I/O class (`ionice -c 3`), so a transfer takes only
what the training job leaves.

Whichever of the two tools exists where the command runs is used (on the host, and again
inside a container whose commands do not descend from the host's shell): the detection is a
few shell built-ins in the command itself, so it costs no round trip and is right on every
host and in every container. A command asked to `announce` writes one stderr line saying what
it got (`dflash-priority trainer: nice 19, ionice idle`), which the transfer reports.
"""

from __future__ import annotations

import shlex

MARK = "dflash-priority"
NICENESS = 19  # the lowest CPU priority
IDLE_CLASS = 3  # ionice's idle class: disk time only when no one else wants it

# Sets $dflash_low to the wrapper words and $dflash_used to what they are, in plain sh.
# `ionice -c 3 true` is tried first: a kernel or container may refuse the idle class.
_DETECT = (
    "dflash_low=; dflash_used=; "
    "if command -v nice >/dev/null 2>&1; then "
    f'dflash_low="nice -n {NICENESS}"; dflash_used="nice {NICENESS}"; fi; '
    "if command -v ionice >/dev/null 2>&1 && "
    f"ionice -c {IDLE_CLASS} true >/dev/null 2>&1; then "
    f'dflash_low="$dflash_low ionice -c {IDLE_CLASS}"; '
    'dflash_used="${dflash_used:+$dflash_used, }ionice idle"; fi; '
)


def low_priority(command: str, *, shell: str = "sh", announce: str | None = None) -> str:
    """`command`, run by `shell -c`, under whichever of nice/ionice exist where it runs (as
    is when neither does). With `announce`, a stderr line `MARK <announce>: <what>` first.
    A subshell: it can stand anywhere a command can, and its `exec` ends only itself."""
    said = ""
    if announce is not None:
        said = f'echo {shlex.quote(f"{MARK} {announce}:")} "${{dflash_used:-none}}" >&2; '
    return f"( {_DETECT}{said}exec $dflash_low {shell} -c {shlex.quote(command)} )"


def announced(stderr: str) -> list[str]:
    """What the announcing commands said they got, in order ('trainer: nice 19, …')."""
    prefix = f"{MARK} "
    return [line.removeprefix(prefix) for line in stderr.splitlines() if line.startswith(prefix)]
