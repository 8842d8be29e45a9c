"""Provision an eval host (uv, the venv, its packages) and deploy the harness to it.

`setup_eval_host` is idempotent: the host keeps a provision record next to the venv (what was
asked for, what got installed, with which python and uv). A rerun reads the record, the venv's
python and its installed distributions, and the deployed harness in ONE SSH round trip and
does nothing when all of it still matches; a changed spec upgrades in place, a broken venv is
rebuilt, `force` recreates it.

uv is called by absolute path (a non-login SSH shell's PATH rarely has it). When the host has
none we try, in order: the official installer (needs internet), `pip install --user uv` with
the host's python3 (needs an index), and finally we push the workstation's own uv binary
(works on air-gapped hosts of the same OS and architecture).

The harness (`remote/dflash_eval`) lands in `{workdir}/harness/<hash>/dflash_eval`, where
<hash> is `harness_hash()` of its *.py files; `{workdir}/harness/current` points at the
deployed one and is switched with an atomic rename.
"""

from __future__ import annotations

import io
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from dflash_eval.version import harness_files, harness_hash

from dflash_ops.core.errors import DiskSpaceError, HostError, RemoteCommandError
from dflash_ops.core.inventory import EvalHost, Inventory, VenvSpec
from dflash_ops.core.units import parse_size
from dflash_ops.remote import probes
from dflash_ops.remote.connection import Host, each_eval_host

BASE_PACKAGES = ("torch", "transformers", "safetensors", "requests")
RECORD_NAME = "dflash-provision.json"
RECORD_FORMAT = 1
HARNESS_SOURCE = Path(__file__).resolve().parents[2] / "remote" / "dflash_eval"
HARNESS_PACKAGE = "dflash_eval"
INSTALLER_URL = "https://astral.sh/uv/install.sh"
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
WHEELHOUSE_CACHE = Path(
    os.environ.get("DFLASH_WHEELHOUSE", Path.home() / ".cache" / "dflash-ops" / "wheelhouse")
)
INSTALL_TIMEOUT = 1800  # seconds: a first CPU torch download on a slow link

# The fields of VenvSpec that decide what the venv contains (uv_dir, cache_dir and min_free
# only decide how it is built): a change in these makes a rerun upgrade.
SPEC_FIELDS = (
    "python",
    "torch",
    "versions",
    "packages",
    "find_links",
    "extra_index_url",
    "offline",
    "wheelhouse",
)

Say = Callable[[str], None]


# --- the harness -------------------------------------------------------------------------


def short_hash(digest: str) -> str:
    return digest[:16]


@dataclass(frozen=True)
class HarnessDeploy:
    digest: str
    path: str  # {workdir}/harness/<short>/dflash_eval
    uploaded: bool
    switched: bool
    files: int


def harness_dir(entry: EvalHost) -> str:
    return f"{entry.workdir.rstrip('/')}/harness"


def deploy_harness(
    host: Host, entry: EvalHost, source: Path = HARNESS_SOURCE, say: Say = print
) -> HarnessDeploy:
    """Upload the harness under its content hash unless it is already there; switch
    `current` to it; byte-compile it with the venv's python."""
    digest = harness_hash(source)
    short = short_hash(digest)
    base = harness_dir(entry)
    target = f"{base}/{short}"
    state = host.run(_harness_state_command(base, short)).stdout.split("\n")
    current, complete = [*state, "", ""][:2]
    python = _venv_python(entry.venv)
    uploaded = False
    if complete.strip() != "complete":
        files = harness_files(source)
        if not files:
            raise HostError(host.name, f"no *.py files under {source}: nothing to deploy")
        compiled = _upload_harness(host, entry, source, files, digest, python)
        uploaded = True
        say(
            f"{host.name}: harness {short} uploaded ({len(files)} files) to {target}"
            + ("" if compiled else f"; not byte-compiled: no venv python at {python} yet")
        )
    switched = current.strip() != short
    if switched:
        host.run(
            f"ln -sfn {shlex.quote(short)} {shlex.quote(base + '/.current.tmp')} && "
            f"mv -T {shlex.quote(base + '/.current.tmp')} {shlex.quote(base + '/current')}"
        )
        say(f"{host.name}: harness current -> {short}")
    if not uploaded and not switched:
        say(f"{host.name}: harness {short} already deployed and current; nothing uploaded")
    return HarnessDeploy(
        digest, f"{target}/{HARNESS_PACKAGE}", uploaded, switched, len(harness_files(source))
    )


def _harness_state_command(base: str, short: str) -> str:
    """Line 1: where `current` points (empty if nowhere); line 2: 'complete' if the hash
    directory was fully written."""
    return (
        f"readlink {shlex.quote(base + '/current')} || echo; "
        f"if [ -f {shlex.quote(f'{base}/{short}/.complete')} ]; then echo complete; "
        "else echo missing; fi"
    )


def _upload_harness(
    host: Host, entry: EvalHost, source: Path, files: list[str], digest: str, python: str
) -> bool:
    """Unpack into a scratch directory, byte-compile, mark complete, rename into place.
    Returns whether it was byte-compiled (False: the venv does not exist yet)."""
    base = harness_dir(entry)
    short = short_hash(digest)
    staging = f"{base}/.incoming-{short}"
    tarball = f"{base}/.incoming-{short}.tar"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for relative in files:
            archive.add(source / relative, arcname=f"{HARNESS_PACKAGE}/{relative}")
    buffer.seek(0)
    host.run(f"mkdir -p {shlex.quote(base)}")
    host.open()
    host.connection.put(buffer, tarball)
    q = shlex.quote
    result = host.run(
        "set -e; "
        f"rm -rf {q(staging)}; mkdir -p {q(staging)}; "
        f"tar -xf {q(tarball)} -C {q(staging)}; rm -f {q(tarball)}; "
        # The byte-compile also proves the venv's python can parse every file.
        f"if [ -x {q(python)} ]; then {q(python)} -m compileall -q {q(staging)}/{HARNESS_PACKAGE}; "
        "else echo no-venv; fi; "
        f"echo {q(digest)} > {q(staging)}/.complete; "
        f"rm -rf {q(f'{base}/{short}')}; mv -T {q(staging)} {q(f'{base}/{short}')}",
        check=False,
    )
    if not result.ok:
        raise RemoteCommandError(
            host.name,
            "unpack and byte-compile the harness",
            result.exit_code,
            result.stderr or result.stdout,
        )
    return "no-venv" not in result.stdout


# --- what the venv should contain ---------------------------------------------------------


def requirements(spec: VenvSpec) -> list[str]:
    """The requirement strings for uv/pip: the base packages and `packages`, with the
    inventory's `versions` ("1.2" pins with ==, a specifier is kept as written)."""
    names = [*BASE_PACKAGES, *spec.packages]
    reqs = []
    for requirement in names:
        name = _requirement_name(requirement)
        version = spec.versions.get(name)
        if version is None:
            reqs.append(requirement)
        elif version[:1] in "<>=!~":
            reqs.append(f"{name}{version}")
        else:
            reqs.append(f"{name}=={version}")
    return reqs


def _requirement_name(requirement: str) -> str:
    for index, char in enumerate(requirement):
        if not (char.isalnum() or char in "-_."):
            return requirement[:index]
    return requirement


def normalize(name: str) -> str:
    """PEP 503 name normalization (dist-info directories use underscores)."""
    return "-".join(part for part in name.lower().replace("_", "-").replace(".", "-").split("-"))


def requested(spec: VenvSpec) -> dict:
    """The part of the spec recorded on the host and compared on a rerun."""
    dumped = spec.model_dump(mode="json")
    return {key: dumped[key] for key in SPEC_FIELDS}


@dataclass(frozen=True)
class Sources:
    """Where uv takes packages from, and why (for the messages and the record)."""

    find_links: tuple[str, ...] = ()
    extra_index_url: tuple[str, ...] = ()
    offline: bool = False
    best_match: bool = False  # pip's rule (best version across indexes), for pip's sources
    no_index: bool = False  # wheelhouse: only find_links
    origin: str = "inventory"

    def uv_args(self, spec: VenvSpec) -> list[str]:
        args: list[str] = []
        for link in self.find_links:
            args += ["--find-links", link]
        if self.no_index:
            return [*args, "--no-index", "--offline"]
        for url in self.extra_index_url:
            args += ["--extra-index-url", url]
        if self.best_match and self.extra_index_url:
            args += ["--index-strategy", "unsafe-best-match"]
        if self.offline:
            args.append("--offline")
        elif spec.torch == "cpu":
            # CPU torch from the PyTorch index for torch only; PyPI stays the index for the rest.
            args += ["--torch-backend", "cpu"]
        return args

    def describe(self) -> str:
        parts = [f"find-links {', '.join(self.find_links)}"] if self.find_links else []
        if self.no_index:
            parts.append("no index")
        elif self.extra_index_url:
            parts.append(f"extra indexes {', '.join(self.extra_index_url)}")
        if self.offline and not self.no_index:
            parts.append("offline")
        return f"{'; '.join(parts) or 'PyPI'} ({self.origin})"


def workstation_pip_sources() -> tuple[list[str], list[str]]:
    """Local find-links and file:// extra indexes from the workstation's pip: $PIP_FIND_LINKS
    first, then `pip config`. Only local ones: those are what a lab (or a host sharing the
    filesystem) can use, and uv does not read pip's settings itself."""
    find_links = os.environ.get("PIP_FIND_LINKS", "").split()
    indexes = os.environ.get("PIP_EXTRA_INDEX_URL", "").split()
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        listed = ""
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        values = value.strip().strip("'\"").split()
        if key.endswith(".find-links"):
            find_links += values
        elif key.endswith(".extra-index-url"):
            indexes += values
    local_links = [link for link in find_links if _local_path(link)]
    local_indexes = [url for url in indexes if url.startswith("file://")]
    return list(dict.fromkeys(local_links)), list(dict.fromkeys(local_indexes))


def _local_path(location: str) -> str | None:
    if location.startswith("file://"):
        return urlparse(location).path
    if location.startswith("/"):
        return location
    return None


def resolve_sources(host: Host, spec: VenvSpec) -> Sources:
    """The inventory's sources; where it sets none, the workstation pip's local ones that
    exist on the host too."""
    if spec.find_links is not None and spec.extra_index_url is not None:
        return Sources(tuple(spec.find_links), tuple(spec.extra_index_url), spec.offline)
    pip_links, pip_indexes = workstation_pip_sources()
    candidates = {
        location: path
        for location in pip_links + pip_indexes
        if (path := _local_path(location)) is not None
    }
    present = set()
    if candidates:
        lines = host.run(
            "; ".join(
                f"[ -e {shlex.quote(path)} ] && echo {shlex.quote(location)}"
                for location, path in candidates.items()
            )
            + "; true"
        ).stdout.splitlines()
        present = {line.strip() for line in lines}
    find_links = (
        spec.find_links
        if spec.find_links is not None
        else [link for link in pip_links if link in present]
    )
    indexes = (
        spec.extra_index_url
        if spec.extra_index_url is not None
        else [url for url in pip_indexes if url in present]
    )
    from_pip = (spec.find_links is None and find_links) or (
        spec.extra_index_url is None and indexes
    )
    return Sources(
        tuple(find_links),
        tuple(indexes),
        spec.offline,
        best_match=spec.extra_index_url is None and bool(indexes),
        origin="inventory + workstation pip config" if from_pip else "inventory",
    )


# --- the host's state, in one round trip --------------------------------------------------


def record_path(spec: VenvSpec) -> str:
    return f"{spec.path.rstrip('/')}/{RECORD_NAME}"


def _venv_python(spec: VenvSpec) -> str:
    return f"{spec.path.rstrip('/')}/bin/python"


def uv_dir(entry: EvalHost) -> str:
    return entry.venv.uv_dir or f"{entry.workdir.rstrip('/')}/bin"


def cache_dir(entry: EvalHost) -> str:
    return entry.venv.cache_dir or f"{entry.workdir.rstrip('/')}/uv-cache"


@dataclass
class HostState:
    record: dict | None
    python_version: str | None  # None: the venv's python does not run
    dists: dict[str, str]  # normalized name -> version, from *.dist-info directories
    uv: str | None  # absolute path of a working uv
    uv_version: str | None
    harness_current: str
    harness_complete: bool


def state_command(entry: EvalHost, short: str) -> str:
    q = shlex.quote
    spec = entry.venv
    python = _venv_python(spec)
    uv_candidates = " ".join(
        [
            q(f"{uv_dir(entry)}/uv"),
            '"$HOME/.local/bin/uv"',
            '"$HOME/.cargo/bin/uv"',
            '"$(command -v uv)"',
        ]
    )
    return "\n".join(
        [
            "echo @@record",
            f"cat -- {q(record_path(spec))} 2>/dev/null",
            "echo; echo @@python",
            f"{q(python)} -c 'import sys; print(sys.version.split()[0])' 2>/dev/null",
            "echo @@dists",
            f"ls {q(spec.path.rstrip('/'))}/lib/python*/site-packages 2>/dev/null"
            " | grep '[.]dist-info$'",
            "echo @@uv",
            f"for u in {uv_candidates}; do "
            'if [ -n "$u" ] && [ -x "$u" ] && v=$("$u" --version 2>/dev/null); then '
            'echo "$u"; echo "$v"; break; fi; done',
            "echo @@harness",
            _harness_state_command(harness_dir(entry), short),
            "echo @@end",
        ]
    )


def parse_state(output: str) -> HostState:
    sections: dict[str, list[str]] = {}
    name = None
    for line in output.splitlines():
        if line.startswith("@@"):
            name = line[2:].strip()
            sections[name] = []
        elif name is not None:
            sections[name].append(line)
    if "end" not in sections:
        raise probes.ProbeParseError(f"unexpected provision state output: {output[-300:]!r}")
    record_text = "\n".join(sections.get("record", [])).strip()
    try:
        record = json.loads(record_text) if record_text else None
    except json.JSONDecodeError:
        record = None  # a damaged record is no record: provision again
    python = [line for line in sections.get("python", []) if line.strip()]
    dists = {}
    for line in sections.get("dists", []):
        stem = line.strip().removesuffix(".dist-info")
        dist_name, _, version = stem.partition("-")
        if version:
            dists[normalize(dist_name)] = version
    uv = [line.strip() for line in sections.get("uv", []) if line.strip()]
    harness = [line.strip() for line in sections.get("harness", [])] + ["", ""]
    return HostState(
        record=record if isinstance(record, dict) else None,
        python_version=python[0].strip() if python else None,
        dists=dists,
        uv=uv[0] if uv else None,
        uv_version=uv[1] if len(uv) > 1 else None,
        harness_current=harness[0],
        harness_complete=harness[1] == "complete",
    )


def venv_problem(state: HostState, spec: VenvSpec) -> str | None:
    """Why the venv needs work (None: it is as recorded and asked for)."""
    if state.python_version is None:
        if state.record is None and not state.dists:
            return "no venv yet"
        return f"the venv's python {_venv_python(spec)} does not run"
    if state.record is None:
        return f"no provision record at {record_path(spec)}"
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


# --- provisioning -------------------------------------------------------------------------


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


def setup_eval_hosts(
    inventory: Inventory,
    name: str | None = None,
    force: bool = False,
    say: Say = print,
    harness_source: Path = HARNESS_SOURCE,
) -> list[Outcome]:
    return [
        setup_eval_host(host, force, say, harness_source)
        for host, _ in each_eval_host(inventory, name)
    ]


def setup_eval_host(
    host: Host, force: bool = False, say: Say = print, harness_source: Path = HARNESS_SOURCE
) -> Outcome:
    started = time.monotonic()
    entry = host.entry
    assert isinstance(entry, EvalHost)
    spec = entry.venv
    outcome = Outcome(host.name)
    short = short_hash(harness_hash(harness_source))
    state = parse_state(host.run(state_command(entry, short)).stdout)
    problem = "--force" if force else venv_problem(state, spec)
    if problem is None:
        assert state.record is not None
        outcome.versions = {name: state.record["resolved"].get(name, "?") for name in BASE_PACKAGES}
        outcome.threads = state.record.get("torch", {}).get("threads")
        outcome.torch_cuda = state.record.get("torch", {}).get("cuda")
    else:
        say(f"{host.name}: provisioning {spec.path}: {problem}")
        _provision(host, entry, state, problem, force, outcome, say)
    if state.harness_complete and state.harness_current == short:
        outcome.harness = HarnessDeploy(
            harness_hash(harness_source),
            f"{harness_dir(entry)}/{short}/{HARNESS_PACKAGE}",
            uploaded=False,
            switched=False,
            files=len(harness_files(harness_source)),
        )
    else:
        outcome.harness = deploy_harness(host, entry, harness_source, say)
        outcome.actions.append(f"harness {short} deployed")
    outcome.seconds = time.monotonic() - started
    return outcome


def _provision(
    host: Host,
    entry: EvalHost,
    state: HostState,
    problem: str,
    force: bool,
    outcome: Outcome,
    say: Say,
) -> None:
    spec = entry.venv
    recorded_python = (state.record or {}).get("requested", {}).get("python")
    rebuild = (
        force
        or state.python_version is None
        or state.record is None
        or recorded_python != spec.python
    )
    if rebuild:
        check_disk(host, entry)
    uv, method = ensure_uv(host, entry, state, say)
    outcome.uv_method = method
    if method != "present":
        outcome.actions.append(f"uv installed ({method})")
    if rebuild:
        create_venv(host, entry, uv)
        outcome.actions.append(f"venv created at {spec.path} (python {spec.python})")
        say(f"{host.name}: venv created at {spec.path}")
    sources = push_wheelhouse(host, entry) if spec.wheelhouse else resolve_sources(host, spec)
    say(f"{host.name}: installing {' '.join(requirements(spec))} from {sources.describe()}")
    previous = state.record or {}
    changed = (
        []
        if rebuild
        else sorted(
            {_requirement_name(r) for r in requirements(spec)}
            ^ {_requirement_name(r) for r in previous.get("requirements", [])}
            | {
                _requirement_name(r)
                for r in set(requirements(spec)) ^ set(previous.get("requirements", []))
            }
        )
    )
    reinstall_torch = not rebuild and previous.get("requested", {}).get("torch") != spec.torch
    summary = install(host, entry, uv, sources, upgrade=changed, reinstall_torch=reinstall_torch)
    outcome.actions.append(f"packages installed ({summary})")
    report = verify(host, spec)
    outcome.versions = {name: report["versions"][name] for name in BASE_PACKAGES}
    outcome.threads = report["threads"]
    outcome.torch_cuda = report["cuda"]
    if spec.torch == "cpu" and report["cuda"]:
        say(
            f"[yellow]warning:[/] {host.name}: CPU torch was asked but torch "
            f"{report['versions']['torch']} is a CUDA {report['cuda']} build; pin a +cpu "
            "version in venv.versions or check the indexes"
        )
    write_record(
        host,
        spec,
        {
            "format": RECORD_FORMAT,
            "requested": requested(spec),
            "requirements": requirements(spec),
            "sources": {
                "find_links": list(sources.find_links),
                "extra_index_url": list(sources.extra_index_url),
                "offline": sources.offline,
                "no_index": sources.no_index,
                "origin": sources.origin,
            },
            "python": {"path": report["python"], "version": report["python_version"]},
            "uv": {"path": uv, "method": method},
            "resolved": report["dists"],
            "torch": {
                "version": report["versions"]["torch"],
                "cuda": report["cuda"],
                "threads": report["threads"],
            },
            "provisioned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    )


def _uv_env(entry: EvalHost) -> str:
    return f"UV_CACHE_DIR={shlex.quote(cache_dir(entry))} UV_NO_PROGRESS=1"


MIN_FREE_FLOOR = 256 << 20  # even a rebuild from a full cache writes metadata and scripts


def check_disk(host: Host, entry: EvalHost) -> None:
    """Refuse before writing when the venv's or the cache's filesystem is short.

    What the uv cache already holds is not downloaded or unpacked again (the venv hard-links
    it), so it counts against `venv.min_free`."""
    cached = host.run(
        f"du -sb {shlex.quote(cache_dir(entry))} 2>/dev/null | cut -f1", check=False
    ).stdout.strip()
    full = parse_size(entry.venv.min_free)
    needed = max(full - int(cached or 0), min(full, MIN_FREE_FLOOR))
    for path, what in ((entry.venv.path, "the venv"), (cache_dir(entry), "the uv cache")):
        free = host.probe(probes.free_bytes(path))
        if free < needed:
            raise DiskSpaceError(
                host.name, path, needed, free, f"{what} (CPU torch + transformers; venv.min_free)"
            )


def create_venv(host: Host, entry: EvalHost, uv: str) -> None:
    spec = entry.venv
    q = shlex.quote
    venv = spec.path.rstrip("/")
    result = host.run(
        f"if [ -e {q(venv)} ] && [ ! -f {q(venv + '/pyvenv.cfg')} ] && "
        f'[ -n "$(ls -A {q(venv)} 2>/dev/null)" ]; then exit 3; fi; '
        f"mkdir -p {q(cache_dir(entry))} && rm -rf {q(venv)} && "
        f"{_uv_env(entry)} {q(uv)} venv --quiet --python {q(spec.python)} {q(venv)}",
        check=False,
        timeout=INSTALL_TIMEOUT,
    )
    if result.exit_code == 3:
        raise HostError(
            host.name,
            f"{venv} exists and is not a venv (no pyvenv.cfg); refusing to delete it. Point "
            "venv.path at a new directory or remove it yourself.",
        )
    if not result.ok:
        detail = (result.stderr or result.stdout).strip()
        if "interpreter" in detail.lower() or "python" in detail.lower():
            raise HostError(
                host.name,
                f"uv could not find or download Python {spec.python} for {venv}: "
                f"{detail.splitlines()[-1] if detail else 'no output'}. Options: install it "
                f"with the system package manager (e.g. apt install python{spec.python}), set "
                "venv.python to a version or interpreter path the host has, or give the host "
                "internet access so uv can download a managed Python.",
            )
        raise RemoteCommandError(host.name, "uv venv", result.exit_code, detail)


def install(
    host: Host,
    entry: EvalHost,
    uv: str,
    sources: Sources,
    upgrade: list[str] = (),
    reinstall_torch: bool = False,
) -> str:
    """`uv pip install` the spec. `upgrade`: packages whose requirement changed (so that
    dropping a pin moves to the newest version instead of keeping the pinned one)."""
    spec = entry.venv
    argv = [uv, "pip", "install", "--python", _venv_python(spec), *sources.uv_args(spec)]
    for name in upgrade:
        argv += ["--upgrade-package", name]
    if reinstall_torch:
        argv += ["--reinstall-package", "torch"]
    argv += requirements(spec)
    command = f"{_uv_env(entry)} {shlex.join(argv)}"
    result = host.run(command, check=False, timeout=INSTALL_TIMEOUT)
    if not result.ok:
        raise HostError(
            host.name,
            f"uv pip install into {spec.path} failed (exit {result.exit_code}):\n"
            f"{_tail(result.stderr or result.stdout)}\nSources were {sources.describe()}; set "
            "venv.find_links / venv.extra_index_url / venv.versions, or venv.wheelhouse: true "
            "for a host without an index.",
        )
    lines = [line.strip() for line in result.stderr.splitlines()]
    done = [line for line in lines if line.startswith(("Installed", "Uninstalled", "Audited"))]
    return "; ".join(done) or "nothing to change"


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join("  " + line for line in text.strip().splitlines()[-lines:])


VERIFY_SCRIPT = """
import importlib.metadata as md, json, sys
import requests, safetensors, torch, transformers
print(json.dumps({
    "python": sys.executable,
    "python_version": sys.version.split()[0],
    "versions": {n: md.version(n) for n in ("torch", "transformers", "safetensors", "requests")},
    "cuda": torch.version.cuda,
    "threads": torch.get_num_threads(),
    "dists": {d.metadata["Name"]: d.version for d in md.distributions()},
}))
"""


def verify(host: Host, spec: VenvSpec) -> dict:
    """Import the packages with the venv's python; their versions, threads, CUDA or not."""
    result = host.run(
        f"{shlex.quote(_venv_python(spec))} -c {shlex.quote(VERIFY_SCRIPT)}",
        check=False,
        timeout=300,
    )
    if not result.ok:
        raise HostError(
            host.name,
            f"the venv {spec.path} does not import torch/transformers/safetensors/requests:\n"
            f"{_tail(result.stderr)}\nRerun with --force to rebuild it.",
        )
    return json.loads(result.stdout.strip().splitlines()[-1])


def write_record(host: Host, spec: VenvSpec, record: dict) -> None:
    path = record_path(spec)
    text = json.dumps(record, indent=1, sort_keys=True)
    host.run(
        f"printf '%s\\n' {shlex.quote(text)} > {shlex.quote(path + '.tmp')} && "
        f"mv -f {shlex.quote(path + '.tmp')} {shlex.quote(path)}"
    )


# --- uv -----------------------------------------------------------------------------------


def workstation_uv() -> Path:
    """The workstation's uv binary (the `uv` package is a dependency of dflash-ops)."""
    try:
        from uv import find_uv_bin

        return Path(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return Path(found)
    raise HostError("workstation", "no uv binary here to push (pip install uv)")


def ensure_uv(host: Host, entry: EvalHost, state: HostState, say: Say) -> tuple[str, str]:
    """A working uv on the host: (absolute path, how it was obtained)."""
    if state.uv:
        say(f"{host.name}: using {state.uv_version or 'uv'} at {state.uv}")
        return state.uv, "present"
    directory = uv_dir(entry)
    target = f"{directory}/uv"
    q = shlex.quote
    host.run(f"mkdir -p {q(directory)}")
    if entry.venv.offline or entry.venv.wheelhouse:
        # An offline host must not try the network: go straight to pushing our own uv.
        failures = ["offline host: installer and pip not tried"]
    else:
        downloaded, failures = _download_uv(host, directory, target)
        if downloaded:
            say(f"{host.name}: uv installed with {downloaded} at {target}")
            return target, downloaded.split()[0]
    push_uv(host, target)
    if not _uv_works(host, target):
        raise HostError(
            host.name,
            f"no working uv: tried {'; '.join(failures)}; the pushed workstation binary at "
            f"{target} does not run there either. Install uv on the host and rerun.",
        )
    say(
        f"{host.name}: uv pushed from the workstation to {target} "
        f"(no installer or index there: {'; '.join(failures)})"
    )
    return target, "pushed"


def _download_uv(host: Host, directory: str, target: str) -> tuple[str | None, list[str]]:
    """Install uv at `target` from the network: the official installer, else pip. Returns
    how it was installed (None: neither worked) and why each way failed."""
    q = shlex.quote
    installer = host.run(
        f"command -v curl >/dev/null || {{ echo 'no curl' >&2; exit 2; }}; "
        f"curl -fsSL --connect-timeout 5 --max-time 60 {INSTALLER_URL} -o {q(target + '.sh')}"
        f" && env UV_UNMANAGED_INSTALL={q(directory)} UV_NO_MODIFY_PATH=1 "
        f"timeout 300 sh {q(target + '.sh')} -q; rc=$?; rm -f {q(target + '.sh')}; exit $rc",
        check=False,
        timeout=400,
    )
    if installer.ok and _uv_works(host, target):
        return "installer (the official one)", []
    failures = [f"installer: {_last_line(installer.stderr) or 'failed'}"]
    scratch = f"{directory}/.pip-uv"
    pip = host.run(
        f"rm -rf {q(scratch)}; PYTHONUSERBASE={q(scratch)} PIP_BREAK_SYSTEM_PACKAGES=1 "
        "timeout 300 python3 -m pip install --user --quiet --disable-pip-version-check "
        f"--no-warn-script-location --retries 1 --timeout 15 uv && "
        f"mv -f {q(scratch + '/bin/uv')} {q(target)}; rc=$?; rm -rf {q(scratch)}; exit $rc",
        check=False,
        timeout=400,
    )
    if pip.ok and _uv_works(host, target):
        return "pip (python3 -m pip install --user uv)", []
    return None, [*failures, f"pip: {_last_line(pip.stderr) or 'failed'}"]


def push_uv(host: Host, target: str) -> None:
    """Copy the workstation's uv binary (same OS and architecture only)."""
    machine = host.run("uname -sm").stdout.split()
    here = [platform.system(), platform.machine()]
    if machine != here:
        raise HostError(
            host.name,
            f"the host is {' '.join(machine)}, the workstation {' '.join(here)}: its uv "
            "binary would not run there. Install uv on the host (pip install uv) and rerun.",
        )
    binary = workstation_uv()
    host.open()
    host.connection.put(str(binary), target + ".part")
    host.run(
        f"chmod 755 {shlex.quote(target + '.part')} && "
        f"mv -f {shlex.quote(target + '.part')} {shlex.quote(target)}"
    )


def _uv_works(host: Host, path: str) -> bool:
    return host.run(f"{shlex.quote(path)} --version", check=False).ok


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- air-gapped wheelhouse -----------------------------------------------------------------


def wheelhouse_remote(entry: EvalHost) -> str:
    return f"{entry.workdir.rstrip('/')}/wheelhouse"


def push_wheelhouse(host: Host, entry: EvalHost) -> Sources:
    """Download the wheels on the workstation for the venv's python and platform, push the
    ones the host lacks, and install from them with no index."""
    spec = entry.venv
    info = json.loads(
        host.run(
            f"{shlex.quote(_venv_python(spec))} -c "
            + shlex.quote(
                "import json, platform, sys; print(json.dumps({'version': '%d%d' % sys.version_info"
                "[:2], 'machine': platform.machine(), 'libc': platform.libc_ver()[1]}))"
            )
        ).stdout
    )
    glibc = info["libc"].replace(".", "_") or "2_17"
    local = WHEELHOUSE_CACHE / f"cp{info['version']}-manylinux_{glibc}_{info['machine']}"
    local.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-input",
        "--dest",
        str(local),
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        info["version"],
        "--abi",
        f"cp{info['version']}",
        "--abi",
        "abi3",
        "--abi",
        "none",
        *[arg for tag in _platform_tags(glibc, info["machine"]) for arg in ("--platform", tag)],
    ]
    for link in spec.find_links or []:
        argv += ["--find-links", link]
    for url in spec.extra_index_url or []:
        argv += ["--extra-index-url", url]
    if spec.extra_index_url is None and spec.torch == "cpu":
        argv += ["--extra-index-url", PYTORCH_CPU_INDEX]
    downloaded = subprocess.run([*argv, *requirements(spec)], capture_output=True, text=True)
    if downloaded.returncode != 0:
        raise HostError(
            "workstation",
            f"pip download of the wheelhouse for {host.name} into {local} failed:\n"
            f"{_tail(downloaded.stderr)}",
        )
    remote = wheelhouse_remote(entry)
    present = set(
        host.run(f"mkdir -p {shlex.quote(remote)} && ls -1 {shlex.quote(remote)}").stdout.split()
    )
    missing = sorted(p.name for p in local.glob("*.whl") if p.name not in present)
    if missing:
        _send_files(host, local, missing, remote)
    return Sources(
        find_links=(remote,),
        no_index=True,
        offline=True,
        origin=f"wheelhouse {local} → {remote}, {len(missing)} wheel(s) pushed",
    )


def _platform_tags(glibc: str, machine: str) -> list[str]:
    """Every manylinux tag the host's glibc accepts: pip does not widen `--platform`."""
    major, _, minor = glibc.partition("_")
    newest = int(minor) if major == "2" and minor.isdigit() else 17
    return [f"manylinux_2_{m}_{machine}" for m in range(newest, 16, -1)] + [
        f"manylinux2014_{machine}",
        f"linux_{machine}",
    ]


def _send_files(host: Host, directory: Path, names: list[str], remote: str) -> None:
    """tar | ssh 'tar -x': bulk bytes over OpenSSH, not paramiko."""
    tar = subprocess.Popen(
        ["tar", "-C", str(directory), "-cf", "-", "--", *names], stdout=subprocess.PIPE
    )
    ssh = subprocess.run(
        host.ssh_argv(f"tar -C {shlex.quote(remote)} -xf -"),
        stdin=tar.stdout,
        capture_output=True,
        text=True,
    )
    assert tar.stdout is not None
    tar.stdout.close()
    if tar.wait() != 0 or ssh.returncode != 0:
        raise HostError(
            host.name,
            f"pushing {len(names)} wheel(s) to {remote} failed: "
            f"{_last_line(ssh.stderr) or 'tar failed'}",
        )


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


def deploy_harness_to(
    inventory: Inventory,
    name: str | None = None,
    say: Say = print,
    source: Path = HARNESS_SOURCE,
) -> list[HarnessDeploy]:
    return [
        deploy_harness(host, entry, source, say) for host, entry in each_eval_host(inventory, name)
    ]
