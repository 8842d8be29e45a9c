"""Files the tool writes on the workstation, with modes of its own choosing.

The login's umask says nothing about what the tool's files should be: with a umask of 000
everything would be world-writable, and anyone on the machine could swap a result or a
staged checkpoint. So every directory is created with an explicit mode (0755, or 0700 for
a run's own files, whose logs may quote prompts and paths) and every file is written 0644,
whatever the umask. Remote hosts get the same through `remote.connection.login_command`.
"""

from __future__ import annotations

import os
from pathlib import Path

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


def write_atomic(path: Path, data: str | bytes, mode: int = FILE_MODE) -> Path:
    """Write `data` to `path` through a partial file renamed over it: a crash leaves the old
    file or the new, never half of one. The file gets `mode` whatever the umask."""
    make_dirs(path.parent)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    content = data.encode("utf-8") if isinstance(data, str) else data
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    partial.replace(path)
    return path
