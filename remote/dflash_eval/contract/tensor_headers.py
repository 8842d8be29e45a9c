"""What a tensor file says about its tensors without reading them: names, shapes, dtypes.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's
dtype, shape and data_offsets, plus `__metadata__`), then the tensors' bytes. Reading the
header alone is how a dry run learns a target's size and a drafter's shapes without torch
(plan/), and how a cache lookup judges an entry without reading megabytes of features.

Stdlib only. `TensorInfo` stands in for a tensor where only its shape is needed: it answers
`.shape`, `.ndim` and `.numel()` as a torch tensor does, so the checks that read shapes
(drafter/settings.py, drafter/fit.py) take either.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bytes per element of each dtype, as a safetensors header names it and as torch names it
# (a pickle's storages: drafter/shape_reader.py).
SAFETENSORS_WIDTHS = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip
TORCH_WIDTHS = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex128": 16, "complex64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip
HEADER_LIMIT = 100_000_000  # safetensors' own bound on a header


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """A tensor's shape and dtype name, without its data."""

    shape: tuple[int, ...]
    dtype: str  # as the file names it ("BF16", or torch's "bfloat16" for a pickle)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)


class HeaderError(ValueError):
    """The file's header is not a well-formed safetensors header."""


def read_header(file: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """(tensor name → TensorInfo, `__metadata__`) of a safetensors file, checked as the
    safetensors library checks it: the offsets tile the data exactly, and each tensor's
    bytes are its elements times its dtype's width."""
    with Path(file).open("rb") as handle:
        head = handle.read(8)
        size = handle.seek(0, 2)
        if len(head) < 8:
            raise HeaderError(f"{size} bytes: shorter than a safetensors header length")
        length = int.from_bytes(head, "little")
        if length > min(HEADER_LIMIT, size - 8):
            raise HeaderError(f"header length {length} past the file's {size} bytes")
        handle.seek(8)
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise HeaderError(f"header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise HeaderError("header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(value, str) for value in metadata.values()
    ):
        raise HeaderError("__metadata__ is not a map of text to text")
    tensors, spans = {}, []
    for name, entry in header.items():
        info, span = _entry(name, entry)
        tensors[name] = info
        spans.append(span)
    end = 0
    for start, stop in sorted(spans):
        if start != end:
            raise HeaderError(f"tensor data does not tile the file (a gap or overlap at {start})")
        end = stop
    if end != size - 8 - length:
        raise HeaderError(f"tensors end at byte {end} of {size - 8 - length} data bytes")
    return tensors, metadata


def _entry(name: str, entry: Any) -> tuple[TensorInfo, tuple[int, int]]:
    try:
        dtype, width = entry["dtype"], SAFETENSORS_WIDTHS[entry["dtype"]]
        shape, (start, stop) = tuple(entry["shape"]), entry["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise HeaderError(f"tensor {name!r} has no valid dtype, shape and offsets") from None
    if not all(type(number) is int for number in (*shape, start, stop)):
        raise HeaderError(f"tensor {name!r} has a size or an offset that is not an integer")
    if min(shape, default=0) < 0 or not 0 <= start <= stop:
        raise HeaderError(f"tensor {name!r} has a negative size or offsets out of order")
    if stop - start != math.prod(shape) * width:
        raise HeaderError(f"tensor {name!r}: {stop - start} bytes for shape {list(shape)}")
    return TensorInfo(shape, dtype), (start, stop)
