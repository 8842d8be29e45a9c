"""The air-gapped route (`venv.wheelhouse: true`): wheels downloaded on the workstation for
the host's python and platform, pushed to `{workdir}/wheelhouse`, installed with no index.

The workstation keeps its downloads in $DFLASH_WHEELHOUSE (default
~/.cache/dflash-ops/wheelhouse), one directory per python/platform; only the wheels the host
lacks are pushed, with tar over OpenSSH (bulk bytes never go through paramiko).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from dflash_ops.core.errors import HostError
from dflash_ops.core.files import make_dirs
from dflash_ops.core.inventory import HarnessHost, VenvSpec
from dflash_ops.provision.packages import Sources, requirements
from dflash_ops.remote.connection import SHARED_UMASK, Host, with_umask
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.remote.messages import output_tail, stderr_reason

PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# The venv python's version, machine and glibc: what the wheels must be built for.
PLATFORM_SCRIPT = (
    "import json, platform, sys; print(json.dumps({'version': '%d%d' % sys.version_info[:2], "
    "'machine': platform.machine(), 'libc': platform.libc_ver()[1]}))"
)


def wheelhouse_cache() -> Path:
    default = Path.home() / ".cache" / "dflash-ops" / "wheelhouse"
    return Path(os.environ.get("DFLASH_WHEELHOUSE", default))


def push_wheelhouse(host: Host, entry: HarnessHost) -> Sources:
    """Download the wheels on the workstation for the venv's python and platform, push the
    ones the host lacks, and install from them with no index."""
    layout = EvalLayout(entry)
    info = json.loads(
        host.run(f"{shlex.quote(layout.python)} -c {shlex.quote(PLATFORM_SCRIPT)}").stdout
    )
    glibc = info["libc"].replace(".", "_") or "2_17"
    local = wheelhouse_cache() / f"cp{info['version']}-manylinux_{glibc}_{info['machine']}"
    make_dirs(local)
    argv = _download_argv(entry.venv, local, info["version"], glibc, info["machine"])
    downloaded = subprocess.run(argv, capture_output=True, text=True)
    if downloaded.returncode != 0:
        raise HostError(
            "workstation",
            f"pip download of the wheelhouse for {host.name} into {local} failed:\n"
            f"{output_tail(downloaded.stderr)}",
        )
    remote = layout.wheelhouse
    listing = f"mkdir -p {shlex.quote(remote)} && ls -1 {shlex.quote(remote)}"
    present = set(host.run(with_umask(SHARED_UMASK, listing)).stdout.split())
    missing = sorted(p.name for p in local.glob("*.whl") if p.name not in present)
    if missing:
        _send_files(host, local, missing, remote)
    return Sources(
        find_links=(remote,),
        no_index=True,
        offline=True,
        origin=f"wheelhouse {local} → {remote}, {len(missing)} wheel(s) pushed",
    )


def _download_argv(
    spec: VenvSpec, local: Path, version: str, glibc: str, machine: str
) -> list[str]:
    """`pip download` of the spec's requirements as binary wheels for the host's python."""
    argv = [
        *(sys.executable, "-m", "pip", "download", "--quiet", "--no-input"),
        *("--dest", str(local), "--only-binary=:all:", "--implementation", "cp"),
        *("--python-version", version),
        *("--abi", f"cp{version}", "--abi", "abi3", "--abi", "none"),
        *[arg for tag in _platform_tags(glibc, machine) for arg in ("--platform", tag)],
    ]
    for link in spec.find_links or []:
        argv += ["--find-links", link]
    for url in spec.extra_index_url or []:
        argv += ["--extra-index-url", url]
    if spec.extra_index_url is None and spec.torch == "cpu":
        argv += ["--extra-index-url", PYTORCH_CPU_INDEX]
    return [*argv, *requirements(spec)]


def _platform_tags(glibc: str, machine: str) -> list[str]:
    """Every manylinux tag the host's glibc accepts: pip does not widen `--platform`."""
    major, _, minor = glibc.partition("_")
    newest = int(minor) if major == "2" and minor.isdigit() else 17
    return [f"manylinux_2_{m}_{machine}" for m in range(newest, 16, -1)] + [
        f"manylinux2014_{machine}",
        f"linux_{machine}",
    ]


def _send_files(host: Host, directory: Path, names: list[str], remote: str) -> None:
    """tar | ssh 'tar -x': bulk bytes over OpenSSH, not paramiko. The host's tar takes
    neither owner nor modes from the archive: the files are the ssh user's, 0644."""
    tar = subprocess.Popen(
        ["tar", "-C", str(directory), "-cf", "-", "--", *names], stdout=subprocess.PIPE
    )
    unpack = f"tar --no-same-owner --no-same-permissions -C {shlex.quote(remote)} -xf -"
    ssh = subprocess.run(
        host.ssh_argv(with_umask(SHARED_UMASK, unpack)),
        stdin=tar.stdout,
        capture_output=True,
        text=True,
    )
    assert tar.stdout is not None
    tar.stdout.close()
    if tar.wait() != 0 or ssh.returncode != 0:
        reason = stderr_reason(ssh.stderr) if ssh.returncode != 0 else "tar failed"
        raise HostError(host.name, f"pushing {len(names)} wheel(s) to {remote} failed: {reason}")
