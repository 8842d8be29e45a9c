"""On-disk cache of completions and target hidden states.

An entry is addressed by the sha256 of its key: every input that determines the value
(target config/weights/tokenizer identity, prompt or sequence tokens, layer ids, dtype,
library versions, device...). The full key is also stored in the entry and compared on
read, so a changed input is always a miss and never a stale hit. Writes are atomic
(temp file + rename), so an interrupted run leaves no half-written entry.

Whether an entry hits is judged without torch, from its stored key (a dry run counts hits:
plan/); reading or writing hidden states imports it then.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval.contract.tensor_headers import read_header

if TYPE_CHECKING:
    import torch

CACHE_FORMAT = 1


def key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_key(key).encode()).hexdigest()


def canonical_key(key: dict[str, Any]) -> str:
    """The key as an entry stores it (and as its file name hashes it)."""
    return json.dumps({"cache_format": CACHE_FORMAT, **key}, sort_keys=True)


def tokens_digest(tokens: list[int]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()


class DiskCache:
    """`root=None` disables caching (every lookup misses, nothing is written)."""

    def __init__(self, root: Path | None) -> None:
        self.root = Path(root) if root is not None else None

    def read_bytes(self, path: Path) -> bytes:
        """An entry's bytes (a subclass checks them as they are read)."""
        return path.read_bytes()

    def _path(self, kind: str, key: dict[str, Any], suffix: str) -> Path | None:
        if self.root is None:
            return None
        return self.root / kind / f"{key_digest(key)}{suffix}"

    def get_completion(self, key: dict[str, Any]) -> list[int] | None:
        path = self._path("completions", key, ".json")
        if path is None or not path.is_file():
            return None
        try:
            entry = json.loads(self.read_bytes(path))
        except (OSError, ValueError):
            return None
        if entry.get("key") != json.loads(canonical_key(key)):
            return None
        return entry["output_ids"]

    def put_completion(self, key: dict[str, Any], output_ids: list[int]) -> None:
        path = self._path("completions", key, ".json")
        if path is not None:
            entry = {"key": json.loads(canonical_key(key)), "output_ids": output_ids}
            _atomic_write(path, json.dumps(entry).encode())

    def get_record(self, kind: str, key: dict[str, Any]) -> dict[str, Any] | None:
        """A small JSON record (e.g. the features' provenance and fidelity)."""
        path = self._path(kind, key, ".json")
        if path is None or not path.is_file():
            return None
        try:
            entry = json.loads(self.read_bytes(path))
        except (OSError, ValueError):
            return None
        return entry["record"] if entry.get("key") == json.loads(canonical_key(key)) else None

    def put_record(self, kind: str, key: dict[str, Any], record: dict[str, Any]) -> None:
        path = self._path(kind, key, ".json")
        if path is not None:
            entry = {"key": json.loads(canonical_key(key)), "record": record}
            _atomic_write(path, json.dumps(entry).encode())

    def get_hidden(self, key: dict[str, Any]) -> dict[int, torch.Tensor] | None:
        path = self._path("hidden", key, ".safetensors")
        if path is None or not path.is_file():
            return None
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as handle:
                if (handle.metadata() or {}).get("key") != canonical_key(key):
                    return None
                return {int(name): handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        except Exception:  # a corrupt entry is a miss, and gets rewritten
            return None

    def has_hidden(self, key: dict[str, Any]) -> bool:
        """Whether `get_hidden` would hit, judged from the entry's stored key alone (its
        tensors, megabytes per prompt, are not read)."""
        path = self._path("hidden", key, ".safetensors")
        if path is None or not path.is_file():
            return False
        try:
            return read_header(path)[1].get("key") == canonical_key(key)
        except (OSError, ValueError):  # a corrupt entry is a miss, as get_hidden counts it
            return False

    def put_hidden(self, key: dict[str, Any], hidden: dict[int, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        path = self._path("hidden", key, ".safetensors")
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=path.parent, suffix=".partial")
        os.close(handle)
        tensors = {str(layer): t.contiguous() for layer, t in hidden.items()}
        save_file(tensors, temp, metadata={"key": canonical_key(key)})
        os.replace(temp, path)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, suffix=".partial")
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    os.replace(temp, path)
