"""Identity of everything a result depends on, and the results file itself.

The layout of the results JSON is documented in docs/results-schema.md; bump
SCHEMA_VERSION whenever a key changes meaning or disappears.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import sys
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from dflash_eval.target import sha256_file

SCHEMA_VERSION = 2


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("torch", "transformers", "safetensors", "tokenizers", "requests"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def host_info(threads: int) -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "python_executable": sys.executable,
    }


def file_identity(files: list[Path]) -> dict[str, Any]:
    """Size and full sha256 of each file; the whole entry's size is their sum."""
    entries = [
        {"path": str(f), "size_bytes": f.stat().st_size, "sha256": sha256_file(f)} for f in files
    ]
    combined = (
        entries[0]["sha256"]
        if len(entries) == 1
        else hashlib.sha256("".join(e["sha256"] for e in entries).encode()).hexdigest()
    )
    return {
        "size_bytes": sum(e["size_bytes"] for e in entries),
        "sha256": combined,
        "files": entries,
    }


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_results(path: Path, results: dict[str, Any]) -> None:
    """Write atomically: a reader never sees a half-written results file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(results, out, indent=2, ensure_ascii=False)
        out.write("\n")
    os.replace(temp, path)
