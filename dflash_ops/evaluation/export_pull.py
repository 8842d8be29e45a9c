"""`fab export-drafter --local DIR`: the drafter directory exported on the eval host, copied
to the workstation. The weights go through an OpenSSH pipe (bulk bytes never through
paramiko) and are checked against the host's sha256; the small files come over the control
connection. Everything lands in DIR.partial first, renamed to DIR once complete. DIR is
replaced only when it holds the export record (`dflash_export.json`, ours) or is empty.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from dflash_eval.contract.weights import EXPORT_MARKER

from dflash_ops.core.errors import OpsError, TransferError
from dflash_ops.core.files import FILE_MODE, make_dirs, write_atomic
from dflash_ops.remote.connection import Host

PULL_PARTIAL = ".dflash-pull-partial"  # in a partial local copy from its first moment on
WEIGHTS = "model.safetensors"
CHUNK = 1 << 20


def _ours_or_free(path: Path, marker: str) -> None:
    """Refuse `path` unless it is absent, an empty directory, or a directory with `marker`."""
    if not path.exists() and not path.is_symlink():
        return
    mine = path.is_dir() and not path.is_symlink()
    if mine and (not any(path.iterdir()) or (path / marker).is_file()):
        return
    raise OpsError(
        f"{path} exists and was not written by export-drafter (no {marker} in it); it is left "
        "as it is. Choose another --local, or move it away yourself."
    )


def pull_export(host: Host, remote: str, local: Path, say: Callable[[str], None]) -> Path:
    """Copy the exported directory `remote` on `host` to `local`; returns `local`."""
    local = Path(local).expanduser().absolute()
    partial = local.with_name(local.name + ".partial")
    _ours_or_free(local, EXPORT_MARKER)
    _ours_or_free(partial, PULL_PARTIAL)
    shutil.rmtree(partial, ignore_errors=True)
    make_dirs(partial)
    (partial / PULL_PARTIAL).touch()
    for name in ("config.json", EXPORT_MARKER):
        data = host.download(f"{remote}/{name}")
        if data is None:
            raise TransferError(f"{host.name}:{remote}/{name} is missing: export again")
        write_atomic(partial / name, data)
    weights = f"{remote}/{WEIGHTS}"
    expected = host.run(f"sha256sum -- {shlex.quote(weights)}").stdout.split()[0]
    found = _stream(host, weights, partial / WEIGHTS)
    if found != expected:
        shutil.rmtree(partial)
        raise TransferError(
            f"{host.name}:{weights} arrived as sha256 {found[:16]}…, the host has "
            f"{expected[:16]}…: the copy was removed; pull again"
        )
    (partial / PULL_PARTIAL).unlink()
    if local.exists():
        shutil.rmtree(local)
    os.replace(partial, local)
    say(f"pulled {host.name}:{remote} → {local} (sha256 {found[:16]}… verified)")
    return local


def _stream(host: Host, remote: str, file: Path) -> str:
    """`remote`'s bytes into `file` through `ssh … cat`; their sha256 as they pass."""
    digest = hashlib.sha256()
    descriptor = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with (
        os.fdopen(descriptor, "wb") as out,
        subprocess.Popen(
            host.ssh_argv(f"cat -- {shlex.quote(remote)}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as reader,
    ):
        assert reader.stdout is not None
        while chunk := reader.stdout.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
        error = reader.stderr.read().decode(errors="replace") if reader.stderr else ""
    if reader.returncode != 0:
        raise TransferError(f"{host.name}: reading {remote} failed: {error.strip()}")
    return digest.hexdigest()
