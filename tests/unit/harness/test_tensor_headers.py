"""contract/tensor_headers.py reads a safetensors header without the library (a dry run has
no torch): it finds what `safetensors.safe_open` finds in a good file, and refuses every file
the library refuses, each damaged in its own way."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from dflash_eval.contract.tensor_headers import HeaderError, TensorInfo, read_header
from safetensors import safe_open
from safetensors.torch import save_file


def library(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    with safe_open(str(path), framework="pt") as handle:
        found = {
            name: TensorInfo(
                tuple(handle.get_slice(name).get_shape()), handle.get_slice(name).get_dtype()
            )
            for name in handle.keys()  # noqa: SIM118
        }
        return found, handle.metadata() or {}


def test_a_good_file_reads_as_the_library_reads_it(tmp_path):
    path = tmp_path / "m.safetensors"
    tensors = {
        "a": torch.zeros(3, 4),
        "b": torch.ones(2, dtype=torch.bfloat16),
        "c": torch.arange(5),
        "empty": torch.zeros(0, 7, dtype=torch.float16),
        "scalar": torch.tensor(1.5),
        "mask": torch.ones(2, 2, dtype=torch.bool),
    }
    save_file(tensors, str(path), metadata={"key": '{"cache_format": 1}'})
    assert read_header(path) == library(path)
    assert read_header(path)[0]["a"] == TensorInfo((3, 4), "F32")


def crafted(path: Path, header: object, data: bytes = b"", length: int | None = None) -> Path:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
DAMAGED = {
    "data cut short": ({"w": F32x2}, bytes(4)),
    "bytes past the data": ({"w": F32x2}, bytes(12)),
    "header not JSON": (b"{not json", b""),
    "header a list": ([1, 2], b""),
    "no dtype": ({"w": {"shape": [2], "data_offsets": [0, 8]}}, bytes(8)),
    "unknown dtype": ({"w": {**F32x2, "dtype": "X9"}}, bytes(8)),
    "negative size": ({"w": {**F32x2, "shape": [-2]}}, bytes(8)),
    "fractional size": ({"w": {**F32x2, "shape": [2.0]}}, bytes(8)),
    "offsets reversed": ({"w": {**F32x2, "data_offsets": [8, 0]}}, bytes(8)),
    "bytes not the shape's": ({"w": {**F32x2, "shape": [3]}}, bytes(8)),
    "overlap": ({"w": F32x2, "v": {**F32x2, "data_offsets": [4, 12]}}, bytes(12)),
    "gap": ({"w": {**F32x2, "data_offsets": [4, 12]}}, bytes(12)),
    "metadata a list": ({"__metadata__": ["k"], "w": F32x2}, bytes(8)),
    "metadata not text": ({"__metadata__": {"k": 1}, "w": F32x2}, bytes(8)),
    "entry not an object": ({"w": [1]}, b""),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_file_is_refused_as_the_library_refuses_it(tmp_path, case):
    header, data = DAMAGED[case]
    path = crafted(tmp_path / "m.safetensors", header, data)
    with pytest.raises(Exception):  # noqa: B017  (the library's errors are its own types)
        library(path)
    with pytest.raises(HeaderError):
        read_header(path)


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x01\x00\x00", struct.pack("<Q", 10**9) + b"{}"],
    ids=["empty", "7 bytes", "long"],
)
def test_a_file_too_short_for_its_header_is_refused(tmp_path, raw):
    path = tmp_path / "m.safetensors"
    path.write_bytes(raw)
    with pytest.raises(Exception):  # noqa: B017
        library(path)
    with pytest.raises(HeaderError):
        read_header(path)


def test_a_file_of_no_tensors_reads_as_the_library_reads_it(tmp_path):
    path = crafted(tmp_path / "m.safetensors", {"__metadata__": {"key": "k"}})
    assert read_header(path) == library(path) == ({}, {"key": "k"})
