"""Output directories the harness writes whole (`extract`, `export`): built in NAME.partial,
then renamed over NAME. A directory is removed or replaced only when its marker file says
that command wrote it (an empty directory made ready for the output excepted); anything
else is refused by name, never touched.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dflash_eval.contract.errors import HarnessError


def remove_own(path: Path, marker: str, command: str, check_only: bool = False) -> None:
    """Remove an earlier copy of ours at `path` (it holds `marker`); refuse anything else."""
    if not path.exists() and not path.is_symlink():
        return
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        path.rmdir()  # an empty directory made ready for the output
        return
    if not path.is_dir() or path.is_symlink() or not (path / marker).is_file():
        raise HarnessError(
            f"{path} exists and was not written by {command} (no {marker} in it); it is left "
            "as it is. Choose another --out, or move it away yourself."
        )
    if not check_only:
        shutil.rmtree(path)


def start_partial(out_dir: Path, marker: str, command: str) -> Path:
    """A fresh NAME.partial beside `out_dir` (an earlier partial of ours removed), after
    checking that `out_dir` itself may be replaced; marked partial from its first moment."""
    partial = out_dir.with_name(out_dir.name + ".partial")
    partial_marker = f".dflash-{command}-partial"
    remove_own(partial, partial_marker, command)
    remove_own(out_dir, marker, command, check_only=True)
    partial.mkdir(parents=True)
    (partial / partial_marker).touch()
    return partial


def promote(partial: Path, out_dir: Path, marker: str, command: str) -> None:
    """The complete `partial` (its `marker` written) becomes `out_dir`."""
    (partial / f".dflash-{command}-partial").unlink()
    remove_own(out_dir, marker, command)
    os.replace(partial, out_dir)
