"""Loading named prompt sets with Hugging Face `datasets`, and the workstation's cache of them.

A set is read once — from the hub (its revision resolved to a commit first, so the record
says exactly what was read) or from local data files given as `--dataset name=PATH` — then
kept, formatted, in the cache; later runs read the cache and need no network. The cache
directory is `$DFLASH_DATASETS_CACHE`, else `$XDG_CACHE_HOME/dflash-ops/datasets`, else
`~/.cache/dflash-ops/datasets`:

    <cache>/<set>/<origin key>/rows.jsonl   one formatted row per line (datasets.format_row)
    <cache>/<set>/<origin key>/origin.json  where they came from; written last, so its
                                            presence marks a complete entry
    <cache>/hf/                             the `datasets` library's own download cache

The origin key is a hash of the repository, config and split (hub) or of the data files'
contents, so local files that change are read again. `fab fetch-datasets --refresh` reads the
hub again (a new revision replaces the entry).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dflash_ops.core.files import make_dirs, write_atomic
from dflash_ops.evaluation.datasets import DatasetError, LoadedSet, SetRequest, format_row

BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv"}


def cache_root() -> Path:
    configured = os.environ.get("DFLASH_DATASETS_CACHE")
    if configured:
        return Path(configured).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "dflash-ops" / "datasets"


def load_set(
    request: SetRequest,
    root: Path | None = None,
    refresh: bool = False,
    say: Callable[[str], None] = lambda message: None,
) -> LoadedSet:
    """The set's formatted rows: from the cache, else read (and cached)."""
    root = root or cache_root()
    entry = root / request.spec.name / _origin_key(request)
    if not refresh:
        cached = _read_entry(request, entry)
        if cached is not None:
            say(f"{request.spec.name}: {len(cached.rows)} rows from the cache ({entry})")
            return cached
    origin, table = _read_files(request, root) if request.files else _read_hub(request, root)
    rows = [format_row(request.spec, index, dict(row)) for index, row in enumerate(table)]
    if not rows:
        raise DatasetError(f"{request.spec.name}: {_where(origin)} holds no rows")
    _write_entry(entry, rows, origin)
    say(f"{request.spec.name}: {len(rows)} rows read from {_where(origin)}, cached in {entry}")
    return LoadedSet(request.spec, rows, origin)


def _origin_key(request: SetRequest) -> str:
    spec = request.spec
    if request.files:
        identity: list[Any] = ["files", *(_file_sha256(path) for path in request.files)]
    else:
        identity = ["hub", spec.repo, spec.config, spec.split]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]


def _read_hub(request: SetRequest, root: Path) -> tuple[dict[str, Any], Any]:
    """The split from the hub at its current revision (resolved to a commit first)."""
    spec = request.spec
    load_dataset = _datasets_loader()
    try:
        from huggingface_hub import HfApi

        revision = HfApi().dataset_info(spec.repo).sha
        table = load_dataset(
            spec.repo, spec.config, split=spec.split, revision=revision, cache_dir=str(root / "hf")
        )
    except Exception as error:  # network, hub and parsing errors come in many types
        raise DatasetError(
            f"{spec.name}: cannot read {spec.repo} (config {spec.config or 'default'}, split "
            f"{spec.split}) from the Hugging Face hub ({type(error).__name__}: "
            f"{str(error)[:300]}), and it is not in the cache at {root / spec.name}. "
            f"Pre-fetch it where the hub is reachable: `fab fetch-datasets --dataset "
            f"{spec.name}` (then copy {root} to this machine, or set DFLASH_DATASETS_CACHE), "
            f"or read local copies of its data files: --dataset {spec.name}=PATH.parquet"
        ) from None
    origin = {
        "repo": spec.repo,
        "config": spec.config,
        "split": spec.split,
        "revision": revision,
    }
    return _stamped(origin), table


def _read_files(request: SetRequest, root: Path) -> tuple[dict[str, Any], Any]:
    """Local data files (parquet, JSON lines or CSV) through `datasets`' own builders."""
    suffixes = {_suffix(path) for path in request.files}
    builders = {BUILDERS.get(suffix) for suffix in suffixes}
    if len(builders) != 1 or None in builders:
        raise DatasetError(
            f"--dataset {request.spec.name}: data files must all be one of "
            f"{', '.join(BUILDERS)} (optionally .gz), got {', '.join(sorted(suffixes))}"
        )
    load_dataset = _datasets_loader()
    files = [str(path) for path in request.files]
    try:
        table = load_dataset(
            builders.pop(), data_files=files, split="train", cache_dir=str(root / "hf")
        )
    except Exception as error:  # the builders raise parser- and arrow-specific errors
        raise DatasetError(
            f"--dataset {request.spec.name}: cannot read {', '.join(files)} "
            f"({type(error).__name__}: {str(error)[:300]})"
        ) from None
    origin = {
        "files": ", ".join(path.name for path in request.files),
        "files_sha256": [_file_sha256(path) for path in request.files],
        "like": f"{request.spec.repo} split {request.spec.split}",
    }
    return _stamped(origin), table


def _datasets_loader() -> Callable[..., Any]:
    try:
        import datasets
        from datasets import load_dataset
    except ImportError:
        raise DatasetError(
            "named prompt sets need the Hugging Face `datasets` package on the workstation: "
            "pip install datasets (make setup installs it)"
        ) from None
    datasets.disable_progress_bars()  # our own lines say what was read; bars garble them
    return load_dataset


def _stamped(origin: dict[str, Any]) -> dict[str, Any]:
    from importlib import metadata

    return {
        **origin,
        "fetched_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "datasets_version": metadata.version("datasets"),
    }


def _read_entry(request: SetRequest, entry: Path) -> LoadedSet | None:
    origin_file, rows_file = entry / "origin.json", entry / "rows.jsonl"
    if not origin_file.exists():
        return None
    try:
        origin = json.loads(origin_file.read_text())
        rows = [json.loads(line) for line in rows_file.read_text().splitlines() if line]
    except (OSError, ValueError):
        return None  # a damaged entry is read again from its origin
    return LoadedSet(request.spec, rows, origin)


def _write_entry(entry: Path, rows: list[dict[str, Any]], origin: dict[str, Any]) -> None:
    make_dirs(entry)
    (entry / "origin.json").unlink(missing_ok=True)  # incomplete until rewritten below
    write_atomic(entry / "rows.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    write_atomic(entry / "origin.json", json.dumps(origin, indent=2) + "\n")


def _where(origin: dict[str, Any]) -> str:
    if "repo" in origin:
        return f"{origin['repo']}@{origin['revision'][:12]}"
    return str(origin["files"])


def _suffix(path: Path) -> str:
    suffixes = path.suffixes
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
