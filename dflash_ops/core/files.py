"""Files the tool writes on the workstation, with modes of its own choosing.

The login's umask says nothing about what the tool's files should be: with a umask of 000
everything would be world-writable, and anyone on the machine could swap a result or a
staged checkpoint. So every directory is created with an explicit mode (0755, or 0700 for
a run's own files, whose logs may quote prompts and paths) and every file is written 0644,
whatever the umask. Remote hosts get the same through `remote.connection.login_command`.

Every local file is written here, through a partial file renamed over the target, and only
over a regular file: a device (`--out /dev/full`), a FIFO, a directory or a symbolic link
named as the target is refused, never replaced. A write that fails (a full disk) leaves no
partial file and the previous file as it was, and says so in one line.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from contextlib import suppress
from pathlib import Path

from dflash_ops.core.errors import OpsError
from dflash_ops.core.units import format_bytes

DIR_MODE = 0o755
PRIVATE_DIR_MODE = 0o700
FILE_MODE = 0o644


def make_dirs(path: Path, mode: int = DIR_MODE) -> Path:
    """`path` and its missing parents, each created with `mode` (mkdir's own mode is
    masked by the umask, so it is set again); existing directories are left as they are."""
    missing = []
    for directory in (path, *path.parents):
        if directory.is_dir():
            break
        missing.append(directory)
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            continue  # made meanwhile by another process: its own mode stands
        directory.chmod(mode)
    return path


def write_atomic(
    path: Path, data: str | bytes, mode: int = FILE_MODE, *, make_parents: bool = True
) -> Path:
    """Write `data` to `path` through a partial file renamed over it: a crash leaves the old
    file or the new, never half of one. The file gets `mode` whatever the umask. Only a
    regular file (or none) is replaced; `make_parents`: missing directories are created
    (a file the user named is written only into a directory that exists). OpsError, naming
    the path, when any of that fails."""
    if make_parents:
        make_dirs(path.parent)
    elif not path.parent.is_dir():
        raise OpsError(
            f"{path}: its directory {path.parent} does not exist: create it first, or name a "
            "file in an existing directory"
        )
    _require_regular(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    content = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        try:
            os.fchmod(fd, mode)
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        partial.replace(path)
    except OSError as error:
        with suppress(OSError):
            partial.unlink(missing_ok=True)
        raise _write_failed(path, error) from None
    return path


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
}


def _require_regular(path: Path) -> None:
    """Refuse a target that is there and no regular file: renaming over it would replace a
    device, a pipe or a link (and what it pointed to would not get the data)."""
    try:
        found = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(found):
        raise OpsError(
            f"{path}: is a symbolic link (to {os.readlink(path)}), not a regular file: refusing "
            "to replace it; name the file it points to, or another file"
        )
    if not stat.S_ISREG(found):
        kind = _KINDS.get(stat.S_IFMT(found), "a special file")
        raise OpsError(
            f"{path}: is {kind}, not a regular file: refusing to write there; name a file"
        )


def _write_failed(path: Path, error: OSError) -> OpsError:
    """One line for a local write that failed: the path, why, and (disk full) the free space."""
    unchanged = "nothing was written and the previous file, if any, is as it was"
    if error.errno not in (errno.ENOSPC, errno.EDQUOT):
        return OpsError(f"{path}: could not write it ({error.strerror}); {unchanged}")
    try:
        free = f"{format_bytes(shutil.disk_usage(path.parent).free)} free"
    except OSError:
        free = "free space unknown"
    return OpsError(
        f"{path}: the disk is full ({free} on its file system); {unchanged}. Free some space "
        "there, or write elsewhere, and retry"
    )
