"""Scalars out of TensorBoard event files, without TensorFlow or protobuf.

An event file is a TFRecord stream: each record is `uint64 length`, `uint32 masked crc32c
of the length`, `length` bytes of data, `uint32 masked crc32c of the data` (little endian;
masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8). Each record's data is an `Event`
protobuf; only what scalars need is decoded:

    Event    { double wall_time = 1; int64 step = 2; Summary summary = 5; … }
    Summary  { repeated Value value = 1; }
    Value    { string tag = 1; float simple_value = 2; TensorProto tensor = 8; … }
    TensorProto { DataType dtype = 1; bytes tensor_content = 4;
                  repeated float float_val = 5; repeated double double_val = 6; … }

PyTorch's SummaryWriter and tensorboardX write `simple_value`; TF2's tf.summary.scalar a
one-element float or double `tensor`. A record cut short at the end of a file is one being
written: it ends the file. Anything else that does not fit is MetricsLogError.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from dflash_ops.core.errors import MetricsLogError

_MASK_DELTA = 0xA282EAD8
_DT_FLOAT, _DT_DOUBLE = 1, 2
# wire types
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def records(data: bytes, where: str) -> Iterator[tuple[int, bytes, int]]:
    """(offset, record data, its stored masked crc) of each whole record in `data`."""
    offset = 0
    while len(data) - offset >= 12:
        header = data[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
        if masked_crc(header) != length_crc:
            raise MetricsLogError(
                f"{where}: byte {offset}: not a TFRecord (the length's checksum does not "
                "match): expected a TensorBoard event file"
            )
        end = offset + 12 + length
        if end + 4 > len(data):
            return  # the last record, still being written
        (data_crc,) = struct.unpack("<I", data[end : end + 4])
        yield offset, data[offset + 12 : end], data_crc
        offset = end + 4


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("a varint runs past its message")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def fields(message: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of a protobuf message: an int for a
    varint, the raw bytes for fixed32/fixed64/length-delimited."""
    pos = 0
    while pos < len(message):
        key, pos = _varint(message, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(message, pos)
            yield number, wire, value
            continue
        if wire == _BYTES:
            size, pos = _varint(message, pos)
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
        else:
            raise ValueError(f"wire type {wire} (groups are not in event files)")
        if pos + size > len(message):
            raise ValueError("a field runs past its message")
        yield number, wire, message[pos : pos + size]
        pos += size


def _tensor_scalar(tensor: bytes) -> float | None:
    """A one-element float or double TensorProto's value (None: another kind of tensor)."""
    dtype, values = None, []
    for number, wire, value in fields(tensor):
        if number == 1 and wire == _VARINT:
            dtype = value
        elif number in (4, 5, 6) and wire == _BYTES:
            values.append((number, value))
    for number, raw in values:
        double = number == 6 or (number == 4 and dtype == _DT_DOUBLE)
        if dtype not in (_DT_FLOAT, _DT_DOUBLE) or len(raw) != (8 if double else 4):
            continue
        return struct.unpack("<d" if double else "<f", raw)[0]
    return None


def _summary_scalars(summary: bytes, tags: set[str]) -> Iterator[tuple[str, float]]:
    for number, wire, value in fields(summary):
        if number != 1 or wire != _BYTES:
            continue
        tag, scalar = None, None
        for inner, inner_wire, inner_value in fields(value):
            if inner == 1 and inner_wire == _BYTES:
                tag = inner_value.decode("utf-8", errors="replace")
            elif inner == 2 and inner_wire == _FIXED32:
                scalar = struct.unpack("<f", inner_value)[0]
            elif inner == 8 and inner_wire == _BYTES:
                scalar = _tensor_scalar(inner_value)
        if tag in tags and scalar is not None:
            yield tag, scalar


def scalars(
    data: bytes, where: str, tags: set[str], steps: set[int]
) -> Iterator[tuple[int, str, float]]:
    """(step, tag, value) of each scalar with one of `tags` logged at one of `steps`, in
    file order. The checksum of a record's data is checked where a value is taken from it."""
    for offset, record, stored_crc in records(data, where):
        try:
            step, found = None, []
            for number, wire, value in fields(record):
                if number == 2 and wire == _VARINT:
                    step = value - (1 << 64) if value >= 1 << 63 else value
                elif number == 5 and wire == _BYTES:
                    found = list(_summary_scalars(value, tags))
        except ValueError as exc:
            raise MetricsLogError(
                f"{where}: byte {offset}: not an event record ({exc}): expected a TensorBoard "
                "event file"
            ) from None
        if step not in steps or not found:
            continue
        if masked_crc(record) != stored_crc:
            raise MetricsLogError(
                f"{where}: byte {offset}: the event's checksum does not match: the file is damaged"
            )
        for tag, value in found:
            yield step, tag, value
