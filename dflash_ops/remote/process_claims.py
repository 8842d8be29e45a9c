"""A recorded pid is a claim to verify on the host, never a process to signal on trust.

A detached run records each process it starts (its wrapper, its harness) in two files: `NAME`
holds the pid and `NAME.start` the process's start time (field 22 of /proc/PID/stat, clock
ticks since boot), written first, so whoever finds `NAME` finds both. Before anything counts
such a process alive, follows it or signals it, the host compares /proc with the record; the
verdict is one of:

- `live`: a process with this pid started at the recorded time: the run's own;
- `gone`: no such process (or it ended before its start could be read: the start file says `-`);
- `stale`: a process with this pid exists but started at another time: not the run's;
- `unverifiable`: no start file beside the pid (written before dflash-ops recorded one) and a
  process with this pid exists: it may be the run's or another's;
- `malformed`: no positive process id in the pid file (empty, `-1`, `0`, `abc`), a damaged
  start file, or something other than a regular file (never read: a FIFO would block);
- `none`: no pid file (the process has not been started yet).

Only `live` is ever signalled. `SHELL` defines the POSIX sh functions: the wrapper records
with `dflash_record PID NAME`, the listing, `follow` and cancel judge with `dflash_claim NAME`
(it sets `$dflash_verdict`, `$dflash_pid` and `$dflash_shown`); `SAID` is the shell word for
the verdict line that `parse_claim` reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_ops.remote.probes import ProbeParseError

VERDICTS = ("none", "malformed", "unverifiable", "gone", "stale", "live")
MAX_PID_DIGITS = 7  # pid_max is at most 2^22 (4194304) on Linux

SHELL = f"""
dflash_start_of() {{
  dflash_rest=${{1##*") "}}
  set -f; set -- $dflash_rest; set +f
  dflash_start=${{20:-}}
}}
dflash_record() {{
  dflash_stat=
  read -r dflash_stat 2>/dev/null < "/proc/$1/stat"
  dflash_start_of "$dflash_stat"
  printf '%s\\n' "${{dflash_start:--}}" > "$2.start.tmp" && mv "$2.start.tmp" "$2.start" &&
  printf '%s\\n' "$1" > "$2.tmp" && mv "$2.tmp" "$2"
}}
dflash_claim() {{
  dflash_verdict=none dflash_pid= dflash_shown=
  [ -e "$1" ] || [ -L "$1" ] || return 0
  dflash_verdict=malformed
  [ -f "$1" ] || return 0
  dflash_pid=$(head -c 16 -- "$1" | tr '\\0' '?')
  dflash_shown=$(printf %s "$dflash_pid" | tr -c '0-9A-Za-z.+-' '?')
  case $dflash_pid in ''|0*|*[!0-9]*) return 0;; esac
  [ ${{#dflash_pid}} -le {MAX_PID_DIGITS} ] || return 0
  if [ ! -e "$1.start" ] && [ ! -L "$1.start" ]; then
    dflash_verdict=gone
    [ -d "/proc/$dflash_pid" ] && dflash_verdict=unverifiable
    return 0
  fi
  [ -f "$1.start" ] || return 0
  dflash_recorded=$(head -c 24 -- "$1.start" | tr '\\0' '?')
  case $dflash_recorded in -) dflash_verdict=gone; return 0;; ''|*[!0-9]*) return 0;; esac
  dflash_stat=$(cat "/proc/$dflash_pid/stat" 2>/dev/null) || {{ dflash_verdict=gone; return 0; }}
  dflash_start_of "$dflash_stat"
  dflash_verdict=stale
  [ "$dflash_start" = "$dflash_recorded" ] && dflash_verdict=live
  return 0
}}
"""
# dflash_start_of: the text after the last ") " (the command name may hold spaces and
# parentheses, even ") "), split into words: field 3 onwards, so field 22 is the 20th word.
# dflash_record reads /proc with a builtin (no fork, so the shell cannot reap a harness that
# ended at once and free its pid before the start is read).

SAID = '"$dflash_verdict${dflash_shown:+ $dflash_shown}"'  # a shell word: "VERDICT[ PID]"


@dataclass(frozen=True)
class Claim:
    verdict: str  # one of VERDICTS
    pid: str = ""  # the pid file's text, '?' for anything but [0-9A-Za-z.+-] ('' for none)

    @property
    def live(self) -> bool:
        return self.verdict == "live"


def parse_claim(text: str) -> Claim:
    verdict, _, pid = text.strip().partition(" ")
    if verdict not in VERDICTS:
        raise ProbeParseError(f"unexpected pid verdict: {text!r}")
    return Claim(verdict, pid)


def doubt(claim: Claim, name: str, host: str) -> str:
    """Why a claim that is not `live` stops anything from signalling its process: one clause
    for a message that already names the run ('' for none or gone)."""
    if claim.verdict == "malformed":
        return (
            f"its {name} file holds {claim.pid!r}, not a process id: a broken run, never signalled"
        )
    if claim.verdict == "unverifiable":
        return (
            f"its {name} file names process {claim.pid} but records no start time (written "
            "before dflash-ops recorded one), so that process cannot be told from another and "
            f"is never signalled: check it (`ps -o pid,lstart,args -p {claim.pid}` on {host}) "
            "and kill it yourself if it is this run's"
        )
    if claim.verdict == "stale":
        return (
            f"not running (stale pid file): process {claim.pid} is another program now "
            f"(it started at another time than the one {name}.start records)"
        )
    return ""
