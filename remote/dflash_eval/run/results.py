"""Identity of everything a result depends on, and the results file itself.

The types of these records (and SCHEMA_VERSION) live in dflash_eval.contract.schema.
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

from dflash_eval.contract.schema import FileEntry, Host, Results
from dflash_eval.target.files import sha256_file


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("torch", "transformers", "safetensors", "tokenizers", "requests"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def host_info(threads: int, device: str = "cpu") -> Host:
    return Host(
        hostname=socket.gethostname(),
        platform=platform.platform(),
        machine=platform.machine(),
        cpu_count=os.cpu_count(),
        torch_threads=threads,
        python_executable=sys.executable,
        device=device_name(device),
    )


def device_name(device: str) -> str:
    """`cpu`, or a CUDA device with the GPU's name (`cuda:0 (NVIDIA H200)`)."""
    if not device.startswith("cuda"):
        return device
    import torch

    index = torch.device(device).index or 0
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def file_identity(files: list[Path], verify: bool = True) -> dict[str, Any]:
    """Size and sha256 of each file; the whole entry's size is their sum.

    Without `verify`, a file's sha256 is taken from the staging manifest beside it
    (`NAME.manifest.json`, written by dflash-ops after a verified transfer) when the manifest
    states the file's size and the file is not newer than the manifest: re-hashing a 17 GB
    checkpoint on every run costs minutes. `sha256_source` says which was used.
    """
    entries = [_file_entry(Path(f), verify) for f in files]
    combined = (
        entries[0]["sha256"]
        if len(entries) == 1
        else hashlib.sha256("".join(e["sha256"] for e in entries).encode()).hexdigest()
    )
    sources = sorted({e["sha256_source"] for e in entries})
    return {
        "size_bytes": sum(e["size_bytes"] for e in entries),
        "sha256": combined,
        "sha256_source": sources[0] if len(sources) == 1 else "mixed",
        "files": entries,
    }


def _file_entry(file: Path, verify: bool) -> FileEntry:
    stat = file.stat()
    recorded = None if verify else staged_sha256(file, stat.st_size, stat.st_mtime_ns)
    return FileEntry(
        path=str(file),
        size_bytes=stat.st_size,
        sha256=recorded or sha256_file(file),
        sha256_source="staging manifest" if recorded else "hashed",
    )


def staged_sha256(file: Path, size: int, mtime_ns: int) -> str | None:
    """The sha256 the staging manifest recorded, when it still describes the file."""
    manifest = Path(f"{file}.manifest.json")
    try:
        recorded = json.loads(manifest.read_text())
        written_ns = manifest.stat().st_mtime_ns
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict) or recorded.get("size") != size or mtime_ns > written_ns:
        return None
    sha = recorded.get("sha256")
    return sha if isinstance(sha, str) and len(sha) == 64 else None


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_results(path: Path, results: Results) -> None:
    """Write atomically: a reader never sees a half-written results file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(results, out, indent=2, ensure_ascii=False)
        out.write("\n")
    os.replace(temp, path)
