"""Remote facts: each probe is the shell command we run plus the parser of its output.

Keeping the two apart lets the parsers be tested on captured output without a host; every
interpolated value is shell-quoted. Probes only read; they never change the host.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Probe(Generic[T]):
    command: str
    parse: Callable[[str], T]


class ProbeParseError(ValueError):
    """The host answered something a probe did not expect."""


# --- free space ---------------------------------------------------------------------------


def free_bytes(path: str) -> Probe[int]:
    """Free bytes for an unprivileged writer on the filesystem that holds `path`, or that will
    hold it: a path that does not exist yet is measured at its nearest existing ancestor."""
    command = (
        f"p={shlex.quote(path)}; "
        'while [ ! -e "$p" ] && [ "$p" != / ] && [ "$p" != . ]; do p=$(dirname -- "$p"); done; '
        'df -B1 --output=avail -- "$p"'
    )
    return Probe(command, parse_df_avail)


def parse_df_avail(output: str) -> int:
    lines = [line.strip() for line in output.strip().splitlines()]
    if len(lines) != 2 or lines[0] != "Avail" or not lines[1].isdigit():
        raise ProbeParseError(f"unexpected df output: {output.strip()!r}")
    return int(lines[1])


# --- files --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileStat:
    size: int
    mtime: int
    kind: str  # 'regular file', 'directory', …


def file_stat_command(quoted_path: str) -> str:
    """The stat command for an already-quoted path (so container wrappers can place it)."""
    return f"stat -c '%s %Y %F' -- {quoted_path} 2>/dev/null || echo missing"


def file_stat(path: str) -> Probe[FileStat | None]:
    return Probe(file_stat_command(shlex.quote(path)), parse_file_stat)


def parse_file_stat(output: str) -> FileStat | None:
    text = output.strip()
    if text == "missing":
        return None
    size, mtime, kind = ([*text.split(" ", 2), "", ""])[:3]
    if not (size.isdigit() and mtime.lstrip("-").isdigit() and kind):
        raise ProbeParseError(f"unexpected stat output: {text!r}")
    return FileStat(int(size), int(mtime), kind)


@dataclass(frozen=True)
class PathInfo:
    stat: FileStat | None  # None: does not exist
    free: int  # free bytes where it is (or would be created)


def paths_info(paths: Sequence[str]) -> Probe[dict[str, PathInfo]]:
    """stat and free space of several paths in one round trip."""
    parts = [f"{file_stat(path).command}; {free_bytes(path).command}" for path in paths]
    separator = "echo '--dflash-ops--'"
    return Probe(
        f" ; {separator}; ".join(parts), lambda output: parse_paths_info(paths, output, separator)
    )


def parse_paths_info(paths: Sequence[str], output: str, separator: str) -> dict[str, PathInfo]:
    marker = separator.split("'")[1]
    chunks = [chunk.strip().splitlines() for chunk in output.split(marker)]
    if len(chunks) != len(paths):
        raise ProbeParseError(f"expected {len(paths)} answers, got {len(chunks)}: {output!r}")
    return {
        path: PathInfo(parse_file_stat(lines[0]), parse_df_avail("\n".join(lines[1:])))
        for path, lines in zip(paths, chunks, strict=True)
    }


# --- tools --------------------------------------------------------------------------------

# How to ask a tool its version (the first output line is kept); "" = don't ask.
VERSION_FLAGS = {"pct": ""}


@dataclass(frozen=True)
class Tool:
    name: str
    path: str | None
    version: str | None

    @property
    def present(self) -> bool:
        return self.path is not None


def tools(names: Sequence[str], extra_dirs: Sequence[str] = ()) -> Probe[dict[str, Tool]]:
    """Where each tool is and its version. `extra_dirs` are searched too (e.g. ~/.local/bin
    for uv, which is often not on a non-login PATH)."""
    path_prefix = "".join(f"{d}:" for d in extra_dirs)
    lines = [f'PATH="{path_prefix}$PATH"']
    for name in names:
        flag = VERSION_FLAGS.get(name, "--version")
        quoted = shlex.quote(name)
        version = f'"$("$p" {flag} 2>&1 </dev/null | head -n 1)"' if flag else '""'
        lines.append(
            f"p=$(command -v {quoted}) && "
            f'printf "%s\\t%s\\t%s\\n" {quoted} "$p" {version} '
            f'|| printf "%s\\t\\t\\n" {quoted}'
        )
    return Probe("; ".join(lines), parse_tools)


def parse_tools(output: str) -> dict[str, Tool]:
    found = {}
    for line in output.splitlines():
        if not line.strip():
            continue
        name, path, version = ([*line.split("\t"), "", ""])[:3]
        found[name] = Tool(name, path or None, version.strip() or None)
    return found


# --- the machine --------------------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    cpus: int
    memory_total: int
    memory_available: int


def machine() -> Probe[Machine]:
    return Probe("nproc; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo", parse_machine)


def parse_machine(output: str) -> Machine:
    lines = output.strip().splitlines()
    try:
        cpus = int(lines[0])
        memory = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines[1:]}
        return Machine(cpus, memory["MemTotal"], memory["MemAvailable"])
    except (IndexError, KeyError, ValueError):
        raise ProbeParseError(f"unexpected nproc/meminfo output: {output.strip()!r}") from None


# --- containers ---------------------------------------------------------------------------


def parse_container_running(output: str) -> bool:
    """`pct status` ('status: running') or `docker inspect -f {{.State.Status}}` ('running')."""
    return output.strip().removeprefix("status:").strip() == "running"


# --- reachability -------------------------------------------------------------------------


def tcp_reachable(address: str, port: int, timeout: int = 3) -> Probe[bool]:
    """Whether this host can open a TCP connection to address:port (bash's /dev/tcp, or
    python3 when bash is absent)."""
    target = f"/dev/tcp/{address}/{port}"
    python = f"import socket; socket.create_connection(({address!r}, {port}), timeout={timeout})"
    command = (
        f"if command -v bash >/dev/null; then "
        f"timeout {timeout} bash -c {shlex.quote(f'exec 3<>{target}')} 2>/dev/null; "
        f"else python3 -c {shlex.quote(python)} 2>/dev/null; fi && echo yes || echo no"
    )
    return Probe(command, lambda output: output.strip().endswith("yes"))
