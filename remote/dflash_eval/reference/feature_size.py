"""How much disk a feature set can take, known before any of it is computed, so that
`features` (and `fab extract-features`, before it launches the run) refuses a set that would
fill the disk hours into the run instead of failing there.

The figure is an **upper bound**, never an average. Per prompt the set holds (feature_set.py):

- `hidden/<sha>.safetensors`: one [T, hidden size] tensor per target layer, in the target's
  dtype (the one `features` chooses: float32 or bfloat16), plus a header that holds the
  entry's cache key. T is the prompt's tokens plus the reference, which is at most
  max_new_tokens + block size tokens (a stop token only shortens it);
- `completions/<sha>.json`: the reference's token ids as JSON, plus its cache key;

and once per set the features record, `feature-set.json` and the directories. Prompt tokens
are counted with the target's tokenizer and chat template. A later turn of a conversation
holds the earlier turns' replies, which are not known yet: each counts as max_new_tokens
plus `REPLY_SLACK_TOKENS` (a reply is text decoded from at most max_new_tokens tokens; read
back, it may take a few more where a cut or a skipped special token left odd bytes). Every
file is rounded up to the filesystem's block, as `df` counts it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_eval.contract.prompts import Prompt
from dflash_eval.reference import cache_keys
from dflash_eval.reference.cache import CACHE_FORMAT
from dflash_eval.reference.conversation import encode_messages

REPLY_SLACK_TOKENS = 16
MIN_BLOCK = 4096  # filesystems allocate whole blocks; tmpfs and ext4 use 4 KiB
TENSOR_HEADER_BYTES = 128  # one tensor's safetensors header entry: name, dtype, shape, offsets
FILE_SLACK_BYTES = 256  # JSON braces, field names, safetensors' length prefix and padding
RECORD_BYTES = 64 * 1024  # the features record, feature-set.json, inputs.json: each far less
SET_DIRECTORIES = 4  # SETDIR and its completions/, hidden/, features/
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def token_bounds(
    prompts: list[Prompt], tokenizer: Any, thinking: bool, max_new_tokens: int, block_size: int
) -> list[int]:
    """Per prompt, the most tokens its hidden states can span (prompt + reference)."""
    asked: dict[str, tuple[tuple[str, str], ...]] = {}
    replies: dict[str, int] = {}  # earlier replies inside each prompt's conversation
    bounds = []
    for prompt in prompts:
        earlier: tuple[tuple[str, str], ...] = ()
        replied = 0
        if prompt.follows is not None:
            earlier = (*asked.get(prompt.follows, ()), ("assistant", ""))
            replied = replies.get(prompt.follows, 0) + 1
        asked[prompt.id] = earlier + prompt.messages
        replies[prompt.id] = replied
        prompt_tokens = len(encode_messages(tokenizer, asked[prompt.id], thinking)[0])
        reply_tokens = replied * (max_new_tokens + REPLY_SLACK_TOKENS)
        bounds.append(prompt_tokens + reply_tokens + max_new_tokens + block_size)
    return bounds


@dataclass(frozen=True)
class SetShape:
    """What decides a set's size, besides its prompts' token bounds."""

    layers: int
    hidden_size: int
    dtype: str  # the target's dtype, which the hidden states are stored in
    vocab_size: int
    shared_key: dict[str, Any]
    completion_source: str
    stops: list[int]
    max_new_tokens: int
    block_size: int
    layer_ids: list[int]


def _key_bytes(key: dict[str, Any]) -> int:
    """Length of the key as cache.py stores it (its canonical JSON), plus room for the
    longest number a field can hold."""
    return len(json.dumps({"cache_format": CACHE_FORMAT, **key}, sort_keys=True)) + 20


def _round_up(count: int, block: int) -> int:
    return -(-count // block) * block


def set_bytes(bounds: list[int], shape: SetShape, block: int) -> int:
    """An upper bound on the bytes the set occupies on a filesystem of `block`-byte blocks."""
    hidden_key = _key_bytes(cache_keys.hidden_key(shape.shared_key, [], shape.layer_ids))
    completion_key = _key_bytes(
        cache_keys.completion_key(
            shape.shared_key,
            shape.completion_source,
            [],
            shape.max_new_tokens,
            shape.stops,
            shape.block_size,
        )
    )
    # safetensors stores the key as a JSON string inside its JSON header: quotes escaped.
    header = 2 * hidden_key + shape.layers * TENSOR_HEADER_BYTES + FILE_SLACK_BYTES
    per_token = shape.layers * shape.hidden_size * ELEMENT_BYTES[shape.dtype]
    id_bytes = len(str(max(shape.vocab_size - 1, 0))) + 2  # "123456, "
    reference = shape.max_new_tokens + shape.block_size
    completion = _round_up(completion_key + reference * id_bytes + FILE_SLACK_BYTES, block)
    total = sum(_round_up(header + tokens * per_token, block) + completion for tokens in bounds)
    return total + 3 * _round_up(RECORD_BYTES, block) + SET_DIRECTORIES * block


@dataclass(frozen=True)
class SpaceNeed:
    """The set's upper bound against the free space where it will be written."""

    path: str  # the existing directory whose filesystem was asked
    free: int
    bound: int  # the whole set
    written: int  # already there: an interrupted build's SETDIR.partial
    prompts: int
    tokens: int  # Σ of the prompts' token bounds
    longest: int
    layers: int
    hidden_size: int
    dtype: str

    @property
    def to_write(self) -> int:
        return max(0, self.bound - self.written)

    @property
    def fits(self) -> bool:
        return self.free >= self.to_write

    def record(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "free_bytes": self.free,
            "upper_bound_bytes": self.bound,
            "written_bytes": self.written,
            "to_write_bytes": self.to_write,
            "prompts": self.prompts,
            "tokens_bound": self.tokens,
            "longest_bound": self.longest,
            "layers": self.layers,
            "hidden_size": self.hidden_size,
            "dtype": self.dtype,
        }

    def describe(self) -> str:
        """The bound and how it was reached, for people."""
        resumed = f"; {_mib(self.written)} already written" if self.written else ""
        return (
            f"at most {_mib(self.to_write)} (an upper bound: {self.prompts} prompts of at most "
            f"{self.longest} tokens, {self.tokens} in all, × {self.layers} layers × "
            f"{self.hidden_size} × {ELEMENT_BYTES[self.dtype]} bytes ({self.dtype}), plus "
            f"completions and keys{resumed})"
        )


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def nearest_existing(path: Path) -> Path:
    return next(p for p in (path, *path.parents) if p.exists())


def allocated_bytes(directory: Path, block: int) -> int:
    """What the files under `directory` occupy, rounded to blocks (0 when it is absent)."""
    if not directory.is_dir():
        return 0
    files = (p for p in directory.rglob("*") if p.is_file())
    return sum(_round_up(p.stat().st_size, block) for p in files)


def measure(setdir: Path, partial: Path, bounds: list[int], shape: SetShape) -> SpaceNeed:
    """The set's bound and the free space of the filesystem that will hold SETDIR."""
    where = nearest_existing(Path(setdir).parent)
    block = max(MIN_BLOCK, os.statvfs(where).f_frsize)
    return SpaceNeed(
        path=str(where),
        free=shutil.disk_usage(where).free,
        bound=set_bytes(bounds, shape, block),
        written=allocated_bytes(partial, block),
        prompts=len(bounds),
        tokens=sum(bounds),
        longest=max(bounds, default=0),
        layers=shape.layers,
        hidden_size=shape.hidden_size,
        dtype=shape.dtype,
    )
