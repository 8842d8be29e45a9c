"""The target's files read without loading the model: its identity (what the cache keys and
the results name it by), its tokenizer and stop tokens, and the sizes of its text weights from
the safetensors headers. No torch: a dry run reads all of this (plan/).

transformers loads a tokenizer without torch when it cannot find torch (the dry run hides it,
cli.py); the tokenizer class and the token ids are the same either way.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.tensor_headers import SAFETENSORS_WIDTHS, HeaderError, read_header

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "generation_config.json",
)
NOT_TEXT_MODEL = ("visual", "vision", "mtp")  # tensors the text model never loads


def target_identity(path: Path) -> dict[str, Any]:
    """What identifies the target's behaviour, cheaply.

    config and tokenizer files are hashed in full; weight files are fingerprinted by name,
    size, mtime and a hash of their safetensors header (tensor names, dtypes, offsets),
    because hashing tens of GB per run is too slow. A re-written weight file changes its
    mtime and so the fingerprint.
    """
    path = Path(path)
    files: dict[str, Any] = {}
    for name in ("config.json", *TOKENIZER_FILES):
        file = path / name
        if file.is_file():
            files[name] = {"size": file.stat().st_size, "sha256": sha256_file(file)}
    for file in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        stat = file.stat()
        files[file.name] = {
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "header_sha256": _header_hash(file),
        }
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {"path": str(path), "name": path.name, "files": files, "fingerprint": digest}


def _header_hash(file: Path) -> str:
    with file.open("rb") as handle:
        head = handle.read(8)
        if file.suffix == ".safetensors" and len(head) == 8:
            size = int.from_bytes(head, "little")
            return hashlib.sha256(head + handle.read(min(size, 100_000_000))).hexdigest()
        return hashlib.sha256(head + handle.read(1 << 20)).hexdigest()


def sha256_file(file: Path) -> str:
    digest = hashlib.sha256()
    with Path(file).open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def text_tensors(path: Path) -> list[tuple[int, int]]:
    """(elements, bytes per element) of each tensor the text model loads, read from the
    safetensors headers alone (a vision tower and an MTP head are left out)."""
    found = []
    for file in sorted(Path(path).glob("*.safetensors")):
        try:
            tensors, _ = read_header(file)
        except (OSError, HeaderError) as error:
            raise HarnessError(
                f"Cannot read the safetensors header of the target's {file}: {error}. The "
                "file is truncated or not safetensors; re-copy the target."
            ) from None
        found += [
            (info.numel(), SAFETENSORS_WIDTHS[info.dtype])
            for name, info in tensors.items()
            if not any(part in name for part in NOT_TEXT_MODEL)
        ]
    return found


def weight_bytes(path: Path) -> int:
    """Bytes of the text model's weights as saved: what loading it reads and holds."""
    return sum(elements * size for elements, size in text_tensors(path))


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as error:
        raise HarnessError(
            f"Cannot load the tokenizer of the target {path}: {error}. The target directory "
            "needs its tokenizer files (tokenizer.json, tokenizer_config.json)."
        ) from None


def stop_token_ids(path: Path, tokenizer: Any) -> list[int]:
    """EOS ids from generation_config.json (may be a list) plus the tokenizer's EOS."""
    ids: list[int] = []
    generation = Path(path) / "generation_config.json"
    if generation.is_file():
        eos = json.loads(generation.read_text()).get("eos_token_id")
        ids += eos if isinstance(eos, list) else [eos] if eos is not None else []
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))
