"""The steps that build the eval venv with uv: check the disk, create the venv, install the
packages, verify they import, write the provision record.

Everything is created under umask 022 (readable by every user of the host); uv runs with its
cache in `{workdir}/uv-cache` (or `venv.cache_dir`), which later rebuilds reuse.
"""

from __future__ import annotations

import json
import shlex

from dflash_ops.core.errors import DiskSpaceError, HostError, NotOursError, RemoteCommandError
from dflash_ops.core.inventory import HarnessHost
from dflash_ops.core.units import parse_size
from dflash_ops.provision.packages import Sources, requirements, split_built_against_torch
from dflash_ops.remote import probes
from dflash_ops.remote.connection import SHARED_UMASK, Host, Result, with_umask
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.remote.messages import output_tail

INSTALL_TIMEOUT = 1800  # seconds: a first CPU torch download on a slow link
MIN_FREE_FLOOR = 256 << 20  # even a rebuild from a full cache writes metadata and scripts

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


def _uv_env(layout: EvalLayout) -> str:
    return f"UV_CACHE_DIR={shlex.quote(layout.uv_cache)} UV_NO_PROGRESS=1"


def check_disk(host: Host, entry: HarnessHost) -> None:
    """Refuse before writing when the venv's or the cache's filesystem is short.

    What the uv cache already holds is not downloaded or unpacked again (the venv hard-links
    it), so it counts against `venv.min_free`."""
    layout = EvalLayout(entry)
    cached = host.run(
        f"du -sb {shlex.quote(layout.uv_cache)} 2>/dev/null | cut -f1", check=False
    ).stdout.strip()
    full = parse_size(entry.venv.min_free)
    needed = max(full - int(cached or 0), min(full, MIN_FREE_FLOOR))
    for path, what in ((entry.venv.path, "the venv"), (layout.uv_cache, "the uv cache")):
        free = host.probe(probes.free_bytes(path))
        if free < needed:
            raise DiskSpaceError(
                host.name, path, needed, free, f"{what} (CPU torch + transformers; venv.min_free)"
            )


def create_venv(host: Host, entry: HarnessHost, uv: str, replace: bool = False) -> None:
    """A new venv at `venv.path`. What was there goes only when it is a venv and the tool's
    record is in it, or the user said `replace`; checked again on the host, at deletion."""
    layout = EvalLayout(entry)
    python = entry.venv.python
    q = shlex.quote
    venv = layout.venv
    unrecorded = "false" if replace else f"[ ! -f {q(layout.provision_record)} ]"
    result = host.run(
        with_umask(
            SHARED_UMASK,
            f"if {probes.occupied(venv)}; then [ -f {q(venv + '/pyvenv.cfg')} ] || exit 3; "
            f"{unrecorded} && exit 4; fi; "
            f"mkdir -p {q(layout.uv_cache)} && rm -rf {q(venv)} && "
            f"{_uv_env(layout)} {q(uv)} venv --quiet --python {q(python)} {q(venv)}",
        ),
        check=False,
        timeout=INSTALL_TIMEOUT,
    )
    if result.exit_code in (3, 4):
        found = "is not a venv (no pyvenv.cfg)" if result.exit_code == 3 else "has no record"
        advice = "Point venv.path at a new directory, or move it away yourself."
        raise NotOursError(host.name, venv, found, advice)
    if not result.ok:
        detail = (result.stderr or result.stdout).strip()
        if "interpreter" in detail.lower() or "python" in detail.lower():
            raise HostError(
                host.name,
                f"uv could not find or download Python {python} for {venv}: "
                f"{detail.splitlines()[-1] if detail else 'no output'}. Options: install it "
                f"with the system package manager (e.g. apt install python{python}), set "
                "venv.python to a version or interpreter path the host has, or give the host "
                "internet access so uv can download a managed Python.",
            )
        raise RemoteCommandError(host.name, "uv venv", result.exit_code, detail)


def install(
    host: Host,
    entry: HarnessHost,
    uv: str,
    sources: Sources,
    upgrade: list[str] = (),
    reinstall_torch: bool = False,
) -> str:
    """`uv pip install` the spec. `upgrade`: packages whose requirement changed (so that
    dropping a pin moves to the newest version instead of keeping the pinned one)."""
    layout = EvalLayout(entry)
    spec = entry.venv
    base = [uv, "pip", "install", "--python", layout.python, *sources.uv_args(spec)]
    argv = list(base)
    for name in upgrade:
        argv += ["--upgrade-package", name]
    if reinstall_torch:
        argv += ["--reinstall-package", "torch"]
    plain, against_torch = split_built_against_torch(requirements(spec))
    commands = [[*argv, *plain]]
    if against_torch:
        # Their builds import torch: built in the venv, once torch is in it.
        commands.append([*base, "--no-build-isolation", *against_torch])
    for each in commands:
        result = _uv_install(host, layout, each)
        if not result.ok:
            break
    if not result.ok:
        raise HostError(
            host.name,
            f"uv pip install into {spec.path} failed (exit {result.exit_code}):\n"
            f"{output_tail(result.stderr or result.stdout)}\nSources were "
            f"{sources.describe()}; set venv.find_links / venv.extra_index_url / "
            "venv.versions, or venv.wheelhouse: true for a host without an index.",
        )
    lines = [line.strip() for line in result.stderr.splitlines()]
    done = [line for line in lines if line.startswith(("Installed", "Uninstalled", "Audited"))]
    return "; ".join(done) or "nothing to change"


def _uv_install(host: Host, layout: EvalLayout, argv: list[str]) -> Result:
    command = with_umask(SHARED_UMASK, f"{_uv_env(layout)} {shlex.join(argv)}")
    return host.run(command, check=False, timeout=INSTALL_TIMEOUT)


def verify(host: Host, entry: HarnessHost) -> dict:
    """Import the packages with the venv's python; their versions, threads, CUDA or not."""
    result = host.run(
        f"{shlex.quote(EvalLayout(entry).python)} -c {shlex.quote(VERIFY_SCRIPT)}",
        check=False,
        timeout=300,
    )
    if not result.ok:
        raise HostError(
            host.name,
            f"the venv {entry.venv.path} does not import torch/transformers/safetensors/"
            f"requests:\n{output_tail(result.stderr)}\nRerun with --force to rebuild it.",
        )
    return json.loads(result.stdout.strip().splitlines()[-1])


def write_record(host: Host, entry: HarnessHost, record: dict) -> None:
    """Replace the provision record atomically (a rerun never reads half of one)."""
    path = EvalLayout(entry).provision_record
    text = json.dumps(record, indent=1, sort_keys=True)
    q = shlex.quote
    host.run(
        with_umask(
            SHARED_UMASK,
            f"printf '%s\\n' {q(text)} > {q(path + '.tmp')} && mv -f {q(path + '.tmp')} {q(path)}",
        )
    )
