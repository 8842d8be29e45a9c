"""`fab setup-eval-host`: provision an eval host's venv and deploy the harness, idempotently.
Features hosts (role: features) are provisioned the same way: they run the same harness.
Several hosts are provisioned at once, each in its own thread.

The host keeps a provision record next to the venv (what was asked for, what got installed,
with which python and uv). A rerun reads the record, the venv's python and its installed
distributions, uv and the deployed harness in ONE SSH round trip and does nothing when all of
it still matches; a changed spec upgrades in place, a broken venv is rebuilt, `force`
recreates it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dflash_eval.contract.version import harness_hash

from dflash_ops.core.errors import NotOursError
from dflash_ops.core.inventory import HarnessHost, Inventory, VenvSpec
from dflash_ops.core.parallel import on_each_host
from dflash_ops.provision.harness import (
    HARNESS_SOURCE,
    HarnessDeploy,
    deploy_harness,
    deployed_unchanged,
    short_hash,
)
from dflash_ops.provision.packages import (
    BASE_PACKAGES,
    Sources,
    requested,
    requirement_name,
    requirements,
    resolve_sources,
)
from dflash_ops.provision.state import (
    ADOPTED,
    RECORD_FORMAT,
    HostState,
    host_state,
    origin,
    venv_problem,
)
from dflash_ops.provision.uv import ensure_uv
from dflash_ops.provision.venv import check_disk, create_venv, install, verify, write_record
from dflash_ops.provision.wheelhouse import push_wheelhouse
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout

Say = Callable[[str], None]


@dataclass
class Outcome:
    host: str
    actions: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    threads: int | None = None
    torch_cuda: str | None = None
    harness: HarnessDeploy | None = None
    uv_method: str | None = None
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        return bool(self.actions)

    def torch_facts(self, versions: dict[str, str], threads: int | None, cuda: str | None) -> None:
        self.versions = {name: versions.get(name, "?") for name in BASE_PACKAGES}
        self.threads = threads
        self.torch_cuda = cuda


def setup_eval_hosts(
    inventory: Inventory,
    name: str | None = None,
    force: bool = False,
    say: Say = print,
    harness_source: Path = HARNESS_SOURCE,
    existing: str | None = None,
    *,
    says: Callable[[str], Say] | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Every eval and features host (or only `name`), all at once (core.parallel: a host that
    fails stops no other; its error is raised once all have ended). `says(host)`: where
    that host's progress goes (default: `say`); `on_outcome` is called as each host is done.
    `existing`: what to do with a venv at venv.path that the tool did not make ("adopt" or
    "replace")."""
    names = [inventory.harness_host(name)[0]] if name else list(inventory.harness_hosts)

    def one(host_name: str) -> Outcome:
        host = Host(inventory, host_name)
        try:
            progress = says(host_name) if says else say
            return setup_eval_host(host, force, progress, harness_source, existing)
        finally:
            host.close()

    done = (lambda _, outcome: on_outcome(outcome)) if on_outcome else None
    return on_each_host(names, one, done)


def setup_eval_host(
    host: Host,
    force: bool = False,
    say: Say = print,
    harness_source: Path = HARNESS_SOURCE,
    existing: str | None = None,
) -> Outcome:
    started = time.monotonic()
    entry = host.entry
    assert isinstance(entry, HarnessHost)
    outcome = Outcome(host.name)
    short = short_hash(harness_hash(harness_source))
    state = host.probe(host_state(EvalLayout(entry), short))
    made_by = origin(state)
    problem = _foreign_venv(host.name, entry, state, existing) if made_by == "foreign" else None
    problem = problem or ("--force" if force else venv_problem(state, entry))
    if problem is None:
        assert state.record is not None
        torch = state.record.get("torch", {})
        outcome.torch_facts(state.record["resolved"], torch.get("threads"), torch.get("cuda"))
    else:
        say(f"{host.name}: provisioning {entry.venv.path}: {problem}")
        adopt = made_by == "foreign" and existing == "adopt"
        rebuild = not adopt and _needs_rebuild(state, entry.venv, force)
        if rebuild and made_by == ADOPTED and existing != "replace":
            raise NotOursError(
                host.name,
                entry.venv.path,
                f"needs rebuilding ({problem}) but was adopted, not made, by dflash-ops",
                "Run `fab setup-eval-host --replace` to delete and rebuild it, or point "
                "venv.path at a new directory.",
            )
        if rebuild and made_by in ("foreign", ADOPTED):
            say(f"{host.name}: deleting {entry.venv.path}, a venv dflash-ops did not make")
        _provision(host, entry, state, rebuild, adopt, existing == "replace", outcome, say)
    if state.harness_complete and state.harness_current == short:
        outcome.harness = deployed_unchanged(entry, harness_source)
    else:
        outcome.harness = deploy_harness(host, entry, harness_source, say)
        outcome.actions.append(f"harness {short} deployed")
    outcome.seconds = time.monotonic() - started
    return outcome


def _foreign_venv(host: str, entry: HarnessHost, state: HostState, existing: str | None) -> str:
    """Why a venv the tool did not make is worked on, once the user said how; else refuse."""
    path = entry.venv.path
    if state.found != "venv":
        raise NotOursError(
            host,
            path,
            "exists and is not a venv (no pyvenv.cfg)",
            "Point venv.path at a new directory, or move it away yourself.",
        )
    if existing is None:
        raise NotOursError(
            host,
            path,
            f"holds a venv without a provision record ({EvalLayout(entry).provision_record})",
            "Choose one: `fab setup-eval-host --adopt` installs the missing packages into it "
            "and records it (it is never deleted); point venv.path at a new directory; or "
            f"`fab setup-eval-host --replace` deletes {path} and builds a new venv there.",
        )
    if existing == "adopt":
        _check_adoptable(host, entry, state)
        return "adopting a venv dflash-ops did not make (--adopt)"
    return "replacing a venv dflash-ops did not make (--replace)"


def _check_adoptable(host: str, entry: HarnessHost, state: HostState) -> None:
    path, wanted, found = entry.venv.path, entry.venv.python, state.python_version
    if found is None:
        raise NotOursError(
            host,
            path,
            "holds a venv whose python does not run",
            "It cannot be adopted: "
            "point venv.path at a new directory, or --replace to delete and rebuild it.",
        )
    if re.fullmatch(r"\d+(\.\d+)*", wanted) and not (found + ".").startswith(wanted + "."):
        raise NotOursError(
            host,
            path,
            f"holds a venv of python {found}, not the {wanted} venv.python asks for",
            f'To adopt it set venv.python: "{".".join(found.split(".")[:2])}"; or point '
            "venv.path at a new directory, or --replace to delete and rebuild it.",
        )


def _needs_rebuild(state: HostState, spec: VenvSpec, force: bool) -> bool:
    previous = state.record or {}
    return (
        force
        or state.python_version is None
        or state.record is None
        or previous.get("requested", {}).get("python") != spec.python
    )


def _provision(
    host: Host,
    entry: HarnessHost,
    state: HostState,
    rebuild: bool,
    adopt: bool,
    replace: bool,
    outcome: Outcome,
    say: Say,
) -> None:
    spec = entry.venv
    previous = state.record or {}
    if rebuild:
        check_disk(host, entry)
    uv, method = ensure_uv(host, entry, state, say)
    outcome.uv_method = method
    if method != "present":
        outcome.actions.append(f"uv installed ({method})")
    if rebuild:
        create_venv(host, entry, uv, replace)
        outcome.actions.append(f"venv created at {spec.path} (python {spec.python})")
        say(f"{host.name}: venv created at {spec.path}")
    sources = push_wheelhouse(host, entry) if spec.wheelhouse else resolve_sources(host, spec)
    say(f"{host.name}: installing {' '.join(requirements(spec))} from {sources.describe()}")
    # Adopting installs only what the venv lacks: what it has that meets the spec stays.
    keep = rebuild or adopt
    changed = [] if keep else _changed_packages(spec, previous)
    reinstall_torch = not keep and previous.get("requested", {}).get("torch") != spec.torch
    summary = install(host, entry, uv, sources, upgrade=changed, reinstall_torch=reinstall_torch)
    outcome.actions.append(f"packages installed ({summary})")
    report = verify(host, entry)
    outcome.torch_facts(report["versions"], report["threads"], report["cuda"])
    if spec.torch == "cpu" and report["cuda"]:
        say(
            f"[yellow]warning:[/] {host.name}: CPU torch was asked but torch "
            f"{report['versions']['torch']} is a CUDA {report['cuda']} build; pin a +cpu "
            "version in venv.versions or check the indexes"
        )
    kept = previous.get("origin") == ADOPTED and not rebuild
    made = ADOPTED if adopt or kept else "created"
    write_record(host, entry, _record(spec, sources, uv, method, report, made))


def _changed_packages(spec: VenvSpec, previous: dict) -> list[str]:
    """Packages added, dropped or whose requirement changed since the recorded install."""
    now = requirements(spec)
    before = previous.get("requirements", [])
    names = {requirement_name(r) for r in now} ^ {requirement_name(r) for r in before}
    return sorted(names | {requirement_name(r) for r in set(now) ^ set(before)})


def _record(
    spec: VenvSpec, sources: Sources, uv: str, method: str, report: dict, made: str
) -> dict:
    """The provision record: what was asked for, from where, what got installed, and whether
    the tool created the venv or adopted the user's (`origin`)."""
    return {
        "format": RECORD_FORMAT,
        "origin": made,
        "requested": requested(spec),
        "requirements": requirements(spec),
        "sources": sources.record(),
        "python": {"path": report["python"], "version": report["python_version"]},
        "uv": {"path": uv, "method": method},
        "resolved": report["dists"],
        "torch": {
            "version": report["versions"]["torch"],
            "cuda": report["cuda"],
            "threads": report["threads"],
        },
        "provisioned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def summary(outcome: Outcome) -> str:
    """One paragraph per host for the task's output."""
    versions = ", ".join(f"{name} {version}" for name, version in outcome.versions.items())
    build = f"CUDA {outcome.torch_cuda}" if outcome.torch_cuda else "CPU"
    harness = short_hash(outcome.harness.digest) if outcome.harness else "?"
    details = f"{versions}; torch {build} build, {outcome.threads} threads; harness {harness}"
    if not outcome.changed:
        return (
            f"[green]{outcome.host}: nothing to do[/] (venv and harness as recorded; "
            f"{details}) in {outcome.seconds:.1f}s"
        )
    return (
        f"[green]{outcome.host}: provisioned[/] in {outcome.seconds:.1f}s: "
        f"{'; '.join(outcome.actions)}\n  {details}"
    )
