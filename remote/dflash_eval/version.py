"""The harness's identity: a content hash of its source files (stdlib only, so that the
workstation computes the same hash before deploying as the harness reports in results)."""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def harness_files(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """The *.py files as sorted POSIX paths relative to the package directory."""
    return sorted(
        path.relative_to(package_dir).as_posix()
        for path in package_dir.rglob("*.py")
        if "__pycache__" not in path.parts and path.is_file()
    )


def harness_hash(package_dir: Path = PACKAGE_DIR) -> str:
    """sha256 over `relative path NUL contents NUL` of every file, in that order: two hosts
    running the same harness code report the same hash."""
    digest = hashlib.sha256()
    for relative in harness_files(package_dir):
        digest.update(relative.encode() + b"\0" + (package_dir / relative).read_bytes() + b"\0")
    return digest.hexdigest()
