"""An eval host's provisioning state, read in ONE round trip, and what it means.

One multi-section probe reads the provision record, the venv python's version, the
distributions installed in the venv, a working uv and the deployed harness; `venv_problem`
says why the venv needs work, or None when a rerun has nothing to do.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from dflash_eval.contract.version import harness_hash

from dflash_ops.core.inventory import HarnessHost, VenvSpec
from dflash_ops.provision.harness import HARNESS_SOURCE, harness_state, short_hash
from dflash_ops.provision.packages import normalize, requested
from dflash_ops.remote import probes
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout

RECORD_FORMAT = 1
ADOPTED = "adopted"  # the record's `origin` for a venv the tool installed into but did not make


@dataclass
class HostState:
    record: dict | None
    found: str  # at venv.path: "nothing" (absent or empty), "venv" (pyvenv.cfg) or "other"
    python_version: str | None  # None: the venv's python does not run
    dists: dict[str, str]  # normalized name -> version, from *.dist-info directories
    uv: str | None  # absolute path of a working uv
    uv_version: str | None
    harness_current: str
    harness_complete: bool


def host_state(layout: EvalLayout, short: str) -> probes.Probe[HostState]:
    """The whole state; `short` is the harness hash whose directory is asked about."""
    combined = probes.together(
        record=probes.Probe(f"cat -- {shlex.quote(layout.provision_record)} 2>/dev/null", _record),
        found=probes.Probe(_found_command(layout.venv), _found),
        python=probes.Probe(
            f"{shlex.quote(layout.python)} -c 'import sys; print(sys.version.split()[0])' "
            "2>/dev/null",
            _python_version,
        ),
        dists=probes.Probe(
            f"ls {shlex.quote(layout.venv)}/lib/python*/site-packages 2>/dev/null"
            " | grep '[.]dist-info$'",
            _dists,
        ),
        uv=probes.Probe(_uv_command(layout), _uv),
        # Last: it always exits 0, and so then does the whole probe.
        harness=harness_state(layout, short),
    )

    def parse(output: str) -> HostState:
        answers = combined.parse(output)
        uv_path, uv_version = answers["uv"]
        return HostState(
            record=answers["record"],
            found=answers["found"],
            python_version=answers["python"],
            dists=answers["dists"],
            uv=uv_path,
            uv_version=uv_version,
            harness_current=answers["harness"].current,
            harness_complete=answers["harness"].complete,
        )

    return probes.Probe(combined.command, parse)


def read_state(host: Host, entry: HarnessHost) -> HostState:
    """The host's state, with the harness asked about the repository's own."""
    return host.probe(host_state(EvalLayout(entry), short_hash(harness_hash(HARNESS_SOURCE))))


def _found_command(venv: str) -> str:
    return (
        f"if [ -f {shlex.quote(venv)}/pyvenv.cfg ]; then echo venv; "
        f"elif {probes.occupied(venv)}; then echo other; else echo nothing; fi"
    )


def _found(output: str) -> str:
    answer = output.strip()
    return answer if answer in ("venv", "other") else "nothing"


def _uv_command(layout: EvalLayout) -> str:
    """The first uv that runs: ours, then the usual per-user installs, then PATH's."""
    candidates = " ".join(
        [
            shlex.quote(f"{layout.uv_dir}/uv"),
            '"$HOME/.local/bin/uv"',
            '"$HOME/.cargo/bin/uv"',
            '"$(command -v uv)"',
        ]
    )
    return (
        f"for u in {candidates}; do "
        'if [ -n "$u" ] && [ -x "$u" ] && v=$("$u" --version 2>/dev/null); then '
        'echo "$u"; echo "$v"; break; fi; done'
    )


def _record(output: str) -> dict | None:
    try:
        record = json.loads(output) if output.strip() else None
    except json.JSONDecodeError:
        return None  # a damaged record is no record: provision again
    return record if isinstance(record, dict) else None


def _python_version(output: str) -> str | None:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[0] if lines else None


def _dists(output: str) -> dict[str, str]:
    dists = {}
    for line in output.splitlines():
        name, _, version = line.strip().removesuffix(".dist-info").partition("-")
        if version:
            dists[normalize(name)] = version
    return dists


def _uv(output: str) -> tuple[str | None, str | None]:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return (lines[0] if lines else None), (lines[1] if len(lines) > 1 else None)


def venv_problem(state: HostState, entry: HarnessHost) -> str | None:
    """Why the venv needs work (None: it is as recorded and asked for)."""
    layout = EvalLayout(entry)
    spec: VenvSpec = entry.venv
    if state.python_version is None:
        if state.record is None and not state.dists:
            return "no venv yet"
        return f"the venv's python {layout.python} does not run"
    if state.record is None:
        return f"no provision record at {layout.provision_record}"
    if state.record.get("format") != RECORD_FORMAT:
        return "the provision record is from another version of dflash-ops"
    if state.record.get("requested") != requested(spec):
        changed = [
            key
            for key, value in requested(spec).items()
            if state.record.get("requested", {}).get(key) != value
        ]
        return f"the inventory's venv spec changed ({', '.join(changed)})"
    resolved = state.record.get("resolved", {})
    missing = [
        f"{name} {version}"
        for name, version in resolved.items()
        if state.dists.get(normalize(name)) != version
    ]
    if missing:
        return f"installed packages differ from the record ({', '.join(missing[:3])}…)"
    return None


def origin(state: HostState) -> str:
    """Who made what stands at venv.path: "nothing" there, "tool" (its record says it created
    it), "adopted" (recorded, but made by the user) or "foreign" (no readable record)."""
    if state.record is not None:
        return ADOPTED if state.record.get("origin") == ADOPTED else "tool"
    return "foreign" if state.found != "nothing" else "nothing"
