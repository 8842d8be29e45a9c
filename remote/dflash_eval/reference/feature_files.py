"""The integrity of a feature set's files, at use.

`feature-set.json` lists every file of the set with its size and sha256 (`files`, relative
paths), recorded when the set is completed. An eval reading the set through `VerifiedCache`
hashes each entry as it reads it (one read into one buffer; the tensors it returns are views
of the very bytes it hashed) and
refuses one whose size or sha256 differs from the list, or that the list does not name: a
flipped value in a hidden-state file would otherwise move τ without a word.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from dflash_eval.contract.errors import HarnessError
from dflash_eval.reference.cache import DiskCache, canonical_key

CHUNK = 1 << 20
FIX = "run `fab extract-features --verify` to check every relayed copy and send it again"


def file_records(root: Path, skip: set[str]) -> dict[str, dict[str, Any]]:
    """{relative path: {"size", "sha256"}} of every file under `root` but `skip`."""
    records = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_file() and name not in skip:
            with path.open("rb") as handle:
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
            records[name] = {"size": path.stat().st_size, "sha256": digest}
    return records


class VerifiedCache(DiskCache):
    """A feature set's entries, each checked against the set's file list as it is read."""

    def __init__(self, root: Path, files: dict[str, dict[str, Any]]) -> None:
        super().__init__(root)
        self.files = files

    def read_bytes(self, path: Path) -> bytearray:
        """The file's bytes, read once into one buffer and hashed chunk by chunk as they
        arrive; refused unless size and sha256 are the listed ones."""
        name = path.relative_to(self.root).as_posix()
        expected = self.files.get(name)
        if expected is None:
            raise HarnessError(
                f"Feature set {self.root}: {name} is not among the files its feature-set.json "
                f"lists: something was added to the set on this host; {FIX}."
            )
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            data = bytearray(size) if size == expected["size"] else bytearray()
            view, done = memoryview(data), 0
            while done < len(data):
                count = handle.readinto(view[done : done + CHUNK])
                if not count:
                    break
                digest.update(view[done : done + count])
                done += count
        if size != expected["size"] or digest.hexdigest() != expected["sha256"]:
            found = f"sha256 {digest.hexdigest()[:16]}…" if data else f"size {size}"
            recorded = f"{expected['sha256'][:16]}…" if data else f"{expected['size']}"
            raise HarnessError(
                f"Feature set {self.root}: {name} does not match feature-set.json ({found}, "
                f"recorded {recorded}): the file changed on this host after the set was made, "
                f"and its numbers cannot be trusted; {FIX}."
            )
        return data

    def get_hidden(self, key: dict[str, Any]) -> dict[int, torch.Tensor] | None:
        """As DiskCache's, but the tensors are views of the very bytes that were verified."""
        path = self._path("hidden", key, ".safetensors")
        if path is None or not path.is_file():
            return None
        data = self.read_bytes(path)
        try:
            metadata, tensors = _safetensors(data)
        except (ValueError, KeyError, TypeError):  # verified but unreadable: a miss, as ever
            return None
        if metadata.get("key") != canonical_key(key):
            return None
        return {int(name): tensor for name, tensor in tensors.items()}


# The safetensors dtype names of the tensors a cache entry holds.
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
}


def _safetensors(data: bytearray) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A safetensors file's metadata and tensors, the tensors sharing `data`'s memory: an
    8-byte little-endian header length, the JSON header (dtype, shape, data_offsets of each
    tensor, `__metadata__`), then the tensors' bytes."""
    length = int.from_bytes(data[:8], "little")
    header = json.loads(bytes(data[8 : 8 + length]))
    metadata = header.pop("__metadata__", None) or {}
    base, tensors = 8 + length, {}
    for name, info in header.items():
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        width = torch.empty(0, dtype=dtype).element_size()
        if not 0 <= start <= end <= len(data) - base or (end - start) % width:
            raise ValueError(f"tensor {name} lies outside the file")
        flat = (
            torch.frombuffer(data, dtype=dtype, count=(end - start) // width, offset=base + start)
            if end > start
            else torch.empty(0, dtype=dtype)
        )
        tensors[name] = flat.reshape(info["shape"])
    return metadata, tensors
