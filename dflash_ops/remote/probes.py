"""Remote facts: each probe is the shell command we run plus the parser of its output.

Keeping the two apart lets the parsers be tested on captured output without a host; every
interpolated value is shell-quoted. Probes only read; they never change the host.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Probe(Generic[T]):
    command: str
    parse: Callable[[str], T]


class ProbeParseError(ValueError):
    """The host answered something a probe did not expect."""


# --- several probes in one round trip ---------------------------------------------------

SECTION_MARK = "@@dflash-ops-section"


def together(**named: Probe) -> Probe[dict[str, object]]:
    """Run several probes in one command; the answer maps each name to its parsed result.

    Each probe's output is preceded by a marker line naming it, so one probe's output can
    never be read as another's, whatever it prints (or fails to print)."""
    script = "".join(
        f"printf '\\n%s %s\\n' {SECTION_MARK} {shlex.quote(name)}\n{{ {probe.command}\n}}\n"
        for name, probe in named.items()
    )

    def parse(output: str) -> dict[str, object]:
        sections = split_sections(output, list(named))
        return {name: probe.parse(sections[name]) for name, probe in named.items()}

    return Probe(script, parse)


def split_sections(output: str, names: Sequence[str]) -> dict[str, str]:
    sections: dict[str, str] = {}
    for part in output.split(f"\n{SECTION_MARK} ")[1:]:
        name, _, body = part.partition("\n")
        sections[name] = body
    missing = [name for name in names if name not in sections]
    if missing:
        raise ProbeParseError(f"no answer for {', '.join(missing)} in {output[-500:]!r}")
    return sections


def occupied(path: str) -> str:
    """A shell test: something stands at `path` (a file, or a directory that is not empty)."""
    q = shlex.quote(path)
    return f'[ -e {q} ] && {{ [ ! -d {q} ] || [ -n "$(ls -A {q} 2>/dev/null)" ]; }}'


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


def local_free_bytes(path: str | Path) -> int:
    """free_bytes' twin for this machine (the workstation, asked directly): free bytes on the
    filesystem that holds (or will hold) `path`."""
    existing = next(p for p in (Path(path), *Path(path).parents) if p.exists())
    return shutil.disk_usage(existing).free


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
    named = {}
    for index, path in enumerate(paths):
        named[f"stat{index}"] = file_stat(path)
        named[f"free{index}"] = free_bytes(path)
    combined = together(**named)

    def parse(output: str) -> dict[str, PathInfo]:
        answers = combined.parse(output)
        return {
            path: PathInfo(answers[f"stat{index}"], answers[f"free{index}"])
            for index, path in enumerate(paths)
        }

    return Probe(combined.command, parse)


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


# --- reachability -------------------------------------------------------------------------


def tcp_reachable(address: str, port: int, timeout: int = 3) -> Probe[bool]:
    """Whether this host can open a TCP connection to address:port (bash's /dev/tcp, or
    python3 when bash is absent)."""
    target = f"/dev/tcp/{shlex.quote(address)}/{int(port)}"
    python = (
        f"import socket; socket.create_connection(({address!r}, {int(port)}), timeout={timeout})"
    )
    command = (
        f"if command -v bash >/dev/null; then "
        f"timeout {timeout} bash -c {shlex.quote(f'exec 3<>{target}')} 2>/dev/null; "
        f"else python3 -c {shlex.quote(python)} 2>/dev/null; fi && echo yes || echo no"
    )
    return Probe(command, lambda output: output.strip().endswith("yes"))


# --- can the venv's transformers build the target? -------------------------------------------

TRANSFORMERS_SCRIPT = """\
import json, sys
try:
    import transformers
except Exception as error:
    print(json.dumps({"version": None, "error": f"transformers does not import: {error}"}))
    raise SystemExit
try:
    config = transformers.AutoConfig.from_pretrained(sys.argv[1])
    answer = {"model_type": config.model_type}
except Exception as error:
    answer = {"error": (str(error).splitlines() or [type(error).__name__])[0][:300]}
print(json.dumps({"version": transformers.__version__, **answer}))
"""


@dataclass(frozen=True)
class TransformersSupport:
    version: str | None  # None: transformers does not import in that venv
    model_type: str | None  # what it built from the target's config.json
    error: str | None  # why it could not


def transformers_support(python: str, target: str) -> Probe[TransformersSupport]:
    """Whether `python`'s transformers builds the config class of the target directory."""
    command = (
        f"{shlex.quote(python)} -I -c {shlex.quote(TRANSFORMERS_SCRIPT)} {shlex.quote(target)}"
        " 2>/dev/null"
    )
    return Probe(command, parse_transformers_support)


def parse_transformers_support(output: str) -> TransformersSupport:
    import json

    lines = [line for line in output.splitlines() if line.startswith("{")]
    if not lines:
        return TransformersSupport(None, None, "the venv's python did not answer")
    answer = json.loads(lines[-1])
    return TransformersSupport(answer.get("version"), answer.get("model_type"), answer.get("error"))
