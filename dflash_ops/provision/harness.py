"""Deploy the eval harness (`remote/dflash_eval`) to an eval host under its content hash.

It lands in `{workdir}/harness/<short>/dflash_eval`, where <short> is the first 16 hex digits
of `harness_hash()` over its *.py files; `{workdir}/harness/current` points at the deployed
one and is switched with an atomic rename. A hash directory is only ever created complete
(unpacked and byte-compiled in a scratch directory, marked, then renamed into place), so an
existing one is never uploaded again.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dflash_eval.contract.version import harness_files, harness_hash

from dflash_ops.core.errors import HostError, RemoteCommandError
from dflash_ops.core.inventory import HarnessHost, Inventory
from dflash_ops.remote.connection import SHARED_UMASK, Host, each_eval_host, with_umask
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.remote.probes import Probe

HARNESS_SOURCE = Path(__file__).resolve().parents[2] / "remote" / "dflash_eval"
HARNESS_PACKAGE = "dflash_eval"

Say = Callable[[str], None]


def short_hash(digest: str) -> str:
    return digest[:16]


@dataclass(frozen=True)
class HarnessDeploy:
    digest: str
    path: str  # {workdir}/harness/<short>/dflash_eval
    uploaded: bool
    switched: bool
    files: int


@dataclass(frozen=True)
class HarnessState:
    current: str  # where `current` points ("" if nowhere)
    complete: bool  # whether the hash directory asked about was fully written


def harness_state(layout: EvalLayout, short: str) -> Probe[HarnessState]:
    q = shlex.quote
    command = (
        f"readlink {q(layout.harness_current)} || echo; "
        f"if [ -f {q(f'{layout.harness_root}/{short}/.complete')} ]; then echo complete; "
        "else echo missing; fi"
    )
    return Probe(command, parse_harness_state)


def parse_harness_state(output: str) -> HarnessState:
    current, complete = [*(line.strip() for line in output.splitlines()), "", ""][:2]
    return HarnessState(current, complete == "complete")


def deploy_harness(
    host: Host, entry: HarnessHost, source: Path = HARNESS_SOURCE, say: Say = print
) -> HarnessDeploy:
    """Upload the harness under its content hash unless it is already there; switch
    `current` to it; byte-compile it with the venv's python."""
    layout = EvalLayout(entry)
    digest = harness_hash(source)
    short = short_hash(digest)
    target = f"{layout.harness_root}/{short}"
    state = host.probe(harness_state(layout, short))
    files = harness_files(source)
    uploaded = not state.complete
    if uploaded:
        if not files:
            raise HostError(host.name, f"no *.py files under {source}: nothing to deploy")
        compiled = _upload(host, layout, source, files, digest)
        say(
            f"{host.name}: harness {short} uploaded ({len(files)} files) to {target}"
            + ("" if compiled else f"; not byte-compiled: no venv python at {layout.python} yet")
        )
    switched = state.current != short
    if switched:
        _switch_current(host, layout, short)
        say(f"{host.name}: harness current -> {short}")
    if not uploaded and not switched:
        say(f"{host.name}: harness {short} already deployed and current; nothing uploaded")
    return HarnessDeploy(digest, f"{target}/{HARNESS_PACKAGE}", uploaded, switched, len(files))


def deployed_unchanged(entry: HarnessHost, source: Path = HARNESS_SOURCE) -> HarnessDeploy:
    """What `deploy_harness` returns when the host already runs `source` (known from a
    state read elsewhere, so no round trip)."""
    digest = harness_hash(source)
    path = f"{EvalLayout(entry).harness_root}/{short_hash(digest)}/{HARNESS_PACKAGE}"
    return HarnessDeploy(digest, path, False, False, len(harness_files(source)))


def deploy_harness_to(
    inventory: Inventory,
    name: str | None = None,
    say: Say = print,
    source: Path = HARNESS_SOURCE,
) -> list[HarnessDeploy]:
    return [
        deploy_harness(host, entry, source, say) for host, entry in each_eval_host(inventory, name)
    ]


def _switch_current(host: Host, layout: EvalLayout, short: str) -> None:
    q = shlex.quote
    scratch = f"{layout.harness_root}/.current.tmp"
    host.run(f"ln -sfn {q(short)} {q(scratch)} && mv -T {q(scratch)} {q(layout.harness_current)}")


def _archive(source: Path, files: list[str]) -> io.BytesIO:
    """A tar of the files with fixed modes and no owner: what lands on the host does not
    depend on the workstation's umask or user ids (root's tar would restore both)."""

    def normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mode = 0o755 if info.isdir() else 0o644
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for relative in files:
            archive.add(
                source / relative, arcname=f"{HARNESS_PACKAGE}/{relative}", filter=normalize
            )
    buffer.seek(0)
    return buffer


def _upload(host: Host, layout: EvalLayout, source: Path, files: list[str], digest: str) -> bool:
    """Unpack into a scratch directory, byte-compile, mark complete, rename into place.
    Returns whether it was byte-compiled (False: the venv does not exist yet)."""
    q = shlex.quote
    base = layout.harness_root
    short = short_hash(digest)
    staging = f"{base}/.incoming-{short}"
    tarball = f"{base}/.incoming-{short}.tar"
    host.run(with_umask(SHARED_UMASK, f"mkdir -p {q(base)}"))
    host.upload(_archive(source, files).getvalue(), tarball)
    python = layout.python
    script = (
        "set -e; "
        f"rm -rf {q(staging)}; mkdir -p {q(staging)}; "
        f"tar --no-same-owner --no-same-permissions -xf {q(tarball)} -C {q(staging)}; "
        f"rm -f {q(tarball)}; "
        # The byte-compile also proves the venv's python can parse every file.
        f"if [ -x {q(python)} ]; then {q(python)} -m compileall -q {q(staging)}/{HARNESS_PACKAGE}; "
        "else echo no-venv; fi; "
        f"echo {q(digest)} > {q(staging)}/.complete; "
        f"rm -rf {q(f'{base}/{short}')}; mv -T {q(staging)} {q(f'{base}/{short}')}"
    )
    result = host.run(with_umask(SHARED_UMASK, script), check=False)
    if not result.ok:
        raise RemoteCommandError(
            host.name,
            "unpack and byte-compile the harness",
            result.exit_code,
            result.stderr or result.stdout,
        )
    return "no-venv" not in result.stdout
