"""What verifying a feature set at use costs (dflash_eval.reference.feature_files.VerifiedCache).

    .venv/bin/python benchmarks/feature_verify.py [--set SETDIR | --lab | --synthetic-mib 512]
                                                   [--entry-mib 8] [--repeats 3] [--smoke]

Reads every hidden-state entry of a set twice over, in turns: as an eval did before
(`DiskCache.get_hidden`, safetensors' own reader) and as it does now (`VerifiedCache`: the
file read once in chunks, each chunk hashed, the bytes checked against `feature-set.json`,
then parsed). The page cache is warmed first, so the figures are the CPU cost of the check,
the part a run pays on every read (a cold disk adds the same read time to both). Printed:
MB/s of each (fastest of --repeats), and the seconds verification adds per GB.

`--set` measures an existing set (e.g. one made by `fab extract-features`); `--lab` builds
the lab's (the tiny lab target over the lab prompts, as the harness tests make it: minutes
on a busy machine); `--synthetic-mib` builds one of that many MiB of float32 entries of
`--entry-mib` each (with a manifest as `features` writes it). Built sets live in a
temporary directory. The machine's raw sha256 rate is printed too: the floor of the check.
`--smoke` measures a synthetic set of two 1 MiB entries once (the suite runs it so).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash_eval.reference.cache import DiskCache, canonical_key
from dflash_eval.reference.feature_files import VerifiedCache, file_records
from dflash_eval.reference.feature_set import MANIFEST

from benchmarks._smoke import parse_args

SMOKE = {"set": None, "lab": False, "synthetic_mib": 2, "entry_mib": 1, "repeats": 1}


def synthetic_set(root: Path, total_mib: int, entry_mib: int) -> Path:
    """A set of float32 hidden-state entries written through the cache, and its file list."""
    import torch

    cache = DiskCache(root)
    rows = entry_mib * (1 << 20) // 4 // 1024  # [rows, 1024] float32 per entry
    for index in range(max(1, total_mib // entry_mib)):
        cache.put_hidden({"entry": index}, {1: torch.randn(rows, 1024)})
    (root / MANIFEST).write_text(json.dumps({"files": file_records(root, {MANIFEST})}))
    return root


def lab_set(root: Path) -> Path:
    """The lab's feature set, as tests/unit/harness/test_feature_sets.py builds it."""
    from dflash_eval.contract.progress import Progress
    from dflash_eval.run.features import FeaturesOptions, run_features

    from dflash_lab.models import build_lab_models

    models = build_lab_models(root / "models")
    setdir = root / "lab-set"
    options = FeaturesOptions(models.target_dir, setdir, [1, 3], 8, models.prompts, 48)
    run_features(options, Progress(quiet=True))
    return setdir


def sha256_rate() -> float:
    """MB/s of hashlib's sha256 over 256 MiB already in memory."""
    data = os.urandom(1 << 24)
    began = time.perf_counter()
    digest = hashlib.sha256()
    for _ in range(16):
        digest.update(data)
    return 16 * len(data) / 1e6 / (time.perf_counter() - began)


def entries(root: Path) -> list[tuple[dict, Path]]:
    """Each hidden entry's key (read back from its metadata) and path."""
    from safetensors import safe_open

    found = []
    for path in sorted((root / "hidden").glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            text = handle.metadata()["key"]
        stored = json.loads(text)
        stored.pop("cache_format")
        assert canonical_key(stored) == text
        found.append((stored, path))
    return found


def timed(cache: DiskCache, keys: list[dict]) -> float:
    began = time.perf_counter()
    for key in keys:
        assert cache.get_hidden(key) is not None
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", type=Path, help="an existing feature set directory")
    parser.add_argument("--lab", action="store_true", help="build and measure the lab's set")
    parser.add_argument("--synthetic-mib", type=int, default=512)
    parser.add_argument("--entry-mib", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args(parser, SMOKE)
    with tempfile.TemporaryDirectory(prefix="dflash-verify-") as scratch:
        if args.set:
            root = args.set
        elif args.lab:
            root = lab_set(Path(scratch))
        else:
            root = synthetic_set(Path(scratch), args.synthetic_mib, args.entry_mib)
        files = json.loads((root / MANIFEST).read_text())["files"]
        found = entries(root)
        keys = [key for key, _ in found]
        size = sum(path.stat().st_size for _, path in found)
        plain, verified = DiskCache(root), VerifiedCache(root, files)
        timed(plain, keys)  # warm the page cache
        best = {"plain": float("inf"), "verified": float("inf")}
        for _ in range(args.repeats):
            best["plain"] = min(best["plain"], timed(plain, keys))
            best["verified"] = min(best["verified"], timed(verified, keys))
        mb = size / 1e6
        print(f"{root}: {len(keys)} hidden-state entries, {mb:.1f} MB")
        for name, seconds in best.items():
            print(f"  {name:9} {seconds:8.3f} s  {mb / seconds:8.0f} MB/s")
        extra = best["verified"] - best["plain"]
        print(f"  verification adds {extra:.3f} s here, {extra / (mb / 1e3):.2f} s per GB")
        print(f"  (sha256 alone on this machine: {sha256_rate():.0f} MB/s)")


if __name__ == "__main__":
    main()
