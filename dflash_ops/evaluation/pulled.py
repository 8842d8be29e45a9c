"""A finished run's files written into the workstation's results, whole or not at all.

`<results>/.<run-id>.partial/` is filled and renamed to `<results>/<run-id>/` only when every
file is written, so a listing never sees half a run. The room is checked before the first
byte (the files are already in memory: their size is known), and a disk that fills meanwhile
leaves no partial either; fetching again once there is room starts afresh. The run's
directory is 0700 and its files 0644 whatever the umask (core/files.py).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from dflash_ops.core.errors import DiskSpaceError, OpsError
from dflash_ops.core.files import PRIVATE_DIR_MODE, make_dirs, write_atomic

WORKSTATION = "workstation"
# Beyond the files themselves: run.json, directory entries, filesystem blocks.
SLACK_BYTES = 64 << 10
ADVICE = "remove old runs from local.results, or point local.results at a larger filesystem"


def store_run(results_root: Path, run_id: str, files: dict[str, bytes]) -> Path:
    """Write `files` (name → bytes) as the run's directory under `results_root`."""
    destination = results_root / run_id
    partial = results_root / f".{run_id}.partial"
    needed = sum(map(len, files.values())) + SLACK_BYTES
    try:
        make_dirs(results_root)
        free = shutil.disk_usage(results_root).free
        if free < needed:
            raise _no_room(results_root, run_id, needed, free)
        make_dirs(partial, PRIVATE_DIR_MODE)  # as the run directory on the host: its logs
        for name, data in files.items():
            write_atomic(partial / name, data)
        partial.replace(destination)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise _no_room(
                results_root, run_id, needed, shutil.disk_usage(results_root).free
            ) from None
        raise OpsError(
            f"{WORKSTATION}: cannot write run {run_id} into {results_root}: {exc.strerror}"
        ) from None
    return destination


def _no_room(results_root: Path, run_id: str, needed: int, free: int) -> DiskSpaceError:
    return DiskSpaceError(
        WORKSTATION, str(results_root), needed, free, f"run {run_id}'s files", ADVICE
    )
