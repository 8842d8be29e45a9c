"""A checkpoint's tensors read as names, shapes and dtypes, without torch
(checkpoint.TensorReader): what a dry run needs (plan/), at the cost of reading a pickle's
few kilobytes instead of loading gigabytes.

A safetensors file gives its header (contract/tensor_headers.py). A torch checkpoint is a zip
whose `<archive>/data.pkl` is the pickled object; its tensors point at storages stored beside
it (`<archive>/data/<key>`). The legacy format is a run of pickles in one file. This reader
unpickles the object with Python's own unpickler under a list narrower than torch's
weights-only one:

- torch's tensor-rebuilding functions and storage types, replaced by functions that record a
  shape and a dtype (`TensorInfo`); a tensor must lie inside its storage, and in a zip the
  storage must hold the bytes it declares, as `torch.load` requires;
- the plain values torch admits (OrderedDict, Counter, set, bytearray, complex, bytes through
  `_codecs.encode`, dtypes, devices and sizes as plain values);
- the inert globals the policy admits (pickle_policy.py).

Any other global is refused as torch refuses it, with the same message, unless the policy
allows a full unpickle; other torch names (quantized or sparse tensors…) are not known here
and say so. tests/unit/harness/test_shape_reader.py holds this reader to `torch.load` on every
kind of checkpoint the harness reads, and test_pickle_inert.py to its refusals.
"""

from __future__ import annotations

import pickle
import pickletools
import zipfile
from _codecs import encode
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.tensor_headers import TORCH_WIDTHS, TensorInfo, read_header
from dflash_eval.drafter.checkpoint import TensorReader
from dflash_eval.drafter.pickle_policy import (
    DAMAGED,
    FULL_UNPICKLE,
    PicklePolicy,
    PickleRecord,
    admitted_objects,
    expand_names,
    refusal,
    start_record,
    unreadable,
)

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of a legacy torch.save file
# torch.save names a storage by its legacy class (torch.BFloat16Storage…): the dtype of each.
STORAGE_DTYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
}  # fmt: skip
PLAIN = {
    "collections.OrderedDict": OrderedDict,
    "collections.Counter": Counter,
    "_codecs.encode": encode,  # how protocol 2 pickles bytes
    "builtins.bytearray": bytearray,
    "builtins.set": set,
    "builtins.complex": complex,
}


@dataclass(frozen=True)
class _StorageType:
    dtype: str


@dataclass(frozen=True)
class _Storage:
    dtype: str
    elements: int


class _TensorClass:
    """torch.Tensor and Parameter, as a rebuild names the type it makes."""


_TENSOR = _TensorClass()


class _Refused(pickle.UnpicklingError):
    """A global off the list: the file is not plain weights."""


class _NotKnownHere(pickle.UnpicklingError):
    """A torch name this reader does not rebuild."""


class _Overrun(pickle.UnpicklingError):
    """A tensor outside its storage, or a storage record short of the bytes it declares."""


def _rebuild_tensor(storage: Any, offset: int, size: Any, stride: Any, *_: Any) -> TensorInfo:
    """torch._utils._rebuild_tensor(_v2): the tensor's shape, checked to lie in its storage."""
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor without its storage")
    shape = tuple(int(length) for length in size)
    steps = tuple(int(step) for step in stride)
    if len(steps) != len(shape) or offset < 0 or min((*shape, *steps), default=0) < 0:
        raise _Overrun(f"a tensor of shape {list(shape)} with strides {list(steps)}")
    span = (
        0 if 0 in shape else 1 + sum((n - 1) * step for n, step in zip(shape, steps, strict=True))
    )
    if offset + span > storage.elements:
        raise _Overrun(
            f"a tensor of shape {list(shape)} past its storage of {storage.elements} elements"
        )
    return TensorInfo(shape, storage.dtype)


def _parameter(data: Any, *_: Any) -> TensorInfo:
    """torch._utils._rebuild_parameter(_with_state): the tensor inside."""
    if not isinstance(data, TensorInfo):
        raise pickle.UnpicklingError("a parameter without its tensor")
    return data


def _from_type(rebuild: Any, new_type: Any, arguments: tuple, _state: Any) -> TensorInfo:
    """torch._tensor._rebuild_from_type_v2 for plain tensors and parameters."""
    if rebuild not in (_rebuild_tensor, _parameter) or new_type is not _TENSOR:
        raise _NotKnownHere("a tensor subclass")
    return rebuild(*arguments)


def _device(kind: str, index: int | None = None) -> str:
    return kind if index is None else f"{kind}:{index}"


TORCH_NAMES: dict[str, Any] = {
    **{f"torch.{name}": _StorageType(dtype) for name, dtype in STORAGE_DTYPES.items()},
    **{f"torch.{dtype}": f"torch.{dtype}" for dtype in TORCH_WIDTHS},  # a dtype as a value
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
    "torch._utils._rebuild_parameter": _parameter,
    "torch._utils._rebuild_parameter_with_state": _parameter,
    "torch._tensor._rebuild_from_type_v2": _from_type,
    "torch.Tensor": _TENSOR,
    "torch.nn.parameter.Parameter": _TENSOR,
    "torch.Size": tuple,
    "torch.device": _device,
}


def python3_name(module: str, name: str) -> tuple[str, str]:
    """A global's module and name as Python 3 knows them (protocol 2 writes Python 2's,
    `__builtin__.set`), mapped as pickle and torch map them."""
    if (module, name) in NAME_MAPPING:
        return NAME_MAPPING[(module, name)]
    return IMPORT_MAPPING.get(module, module), name


class _Unpickler(pickle.Unpickler):
    def __init__(
        self,
        file: IO[bytes],
        admitted: dict[str, Any],
        storage_bytes: Callable[[str], int | None],
        unsafe: bool,
    ) -> None:
        super().__init__(file)
        self.admitted, self.storage_bytes, self.unsafe = admitted, storage_bytes, unsafe

    def find_class(self, module: str, name: str) -> Any:
        module, name = python3_name(module, name)
        full = f"{module}.{name}"
        if full in self.admitted:
            return self.admitted[full]
        if module == "torch" or module.startswith("torch."):
            raise _NotKnownHere(full)
        if self.unsafe:
            return super().find_class(module, name)
        raise _Refused(f"Unsupported global: GLOBAL {full} was not an allowed global by default")

    def persistent_load(self, pid: Any) -> _Storage:
        """('storage', type, key, location, elements[, view]): a storage torch.save wrote."""
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] in ("storage", b"storage")):
            raise pickle.UnpicklingError(f"persistent id {pid!r} is not a storage")
        kind, key, elements = pid[1], str(pid[2]), int(pid[4])
        if not isinstance(kind, _StorageType):
            raise _NotKnownHere(f"a storage of type {kind!r}")
        needed, stored = elements * TORCH_WIDTHS[kind.dtype], self.storage_bytes(key)
        if stored is not None and stored < needed:
            raise _Overrun(f"storage {key} holds {stored} bytes of {needed}")
        return _Storage(kind.dtype, elements)


def _load(path: Path, admitted: dict[str, Any], unsafe: bool) -> Any:
    with path.open("rb") as file:
        if zipfile.is_zipfile(file):
            with zipfile.ZipFile(file) as archive:
                prefix = _archive_prefix(archive)
                sizes = {
                    info.filename[len(prefix) + 5 :]: info.file_size
                    for info in archive.infolist()
                    if info.filename.startswith(f"{prefix}data/")
                }
                with archive.open(f"{prefix}data.pkl") as data:
                    return _Unpickler(data, admitted, sizes.get, unsafe).load()
        # The legacy format: magic number, protocol version, system information, the object
        # (its storages follow it, at sizes this reader does not check).
        file.seek(0)
        header = _Unpickler(file, admitted, lambda _: None, unsafe)
        if header.load() != LEGACY_MAGIC:
            raise pickle.UnpicklingError("neither a zip archive nor a legacy torch.save file")
        header.load(), header.load()
        return _Unpickler(file, admitted, lambda _: None, unsafe).load()


def _archive_prefix(archive: zipfile.ZipFile) -> str:
    """The folder torch.save put the record in (`<name>/`)."""
    found = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith("/data.pkl")]
    if len(found) != 1:
        raise pickle.UnpicklingError(f"{len(found)} data.pkl records in the archive")
    return found[0].removesuffix("data.pkl")


def file_globals(path: Path) -> list[str] | None:
    """The globals a zip checkpoint names beyond torch's own plain ones, read without
    running anything (as torch.serialization.get_unsafe_globals_in_checkpoint reads them);
    None for the legacy format or an unreadable file."""
    try:
        with zipfile.ZipFile(path) as archive:
            data = archive.read(f"{_archive_prefix(archive)}data.pkl")
        named = {
            ".".join(python3_name(*argument.split(" ", 1)))
            for opcode, argument, _ in pickletools.genops(data)
            if opcode.name == "GLOBAL"
        }
    except (*DAMAGED, pickle.UnpicklingError):
        return None
    return sorted(named - set(PLAIN) - set(TORCH_NAMES))


def _admitted(names: list[str]) -> dict[str, Any]:
    return {**PLAIN, **TORCH_NAMES, **{name: obj for obj, name in admitted_objects(names)}}


def storage_overrun(path: Path, policy: PicklePolicy) -> str | None:
    """Why a checkpoint's tensors reach past the bytes stored for them; None when they do
    not, or when this reader cannot tell (a refused or unknown global: torch.load judges
    those). The run asks first: torch.load with mmap does not check, and reads past a short
    record into whatever follows it."""
    try:
        _load(path, _admitted(expand_names(policy.safe_globals)), unsafe=False)
    except _Overrun as overrun:
        return str(overrun)
    except (*DAMAGED, pickle.UnpicklingError):
        return None
    return None


def read_pickle(path: Path, policy: PicklePolicy) -> tuple[Any, PickleRecord]:
    """The checkpoint with every tensor as a TensorInfo, read under the policy."""
    names, record = start_record(policy)
    record.file_globals = file_globals(path)
    admitted = _admitted(names)
    try:
        try:
            return _load(path, admitted, unsafe=False), record
        except _Refused as refused:
            if not policy.allow_unsafe:
                raise HarnessError(refusal(path, str(refused), record.file_globals)) from None
        record.loaded_with = FULL_UNPICKLE
        return _load(path, admitted, unsafe=True), record
    except _NotKnownHere as unknown:
        raise HarnessError(
            f"Cannot read {path} without torch: it holds {unknown}, which this reader does not "
            "rebuild (it reads plain tensors, storages and dtypes). The run reads it with "
            "torch; to plan it, extract the checkpoint first (python -m dflash_eval extract)."
        ) from None
    except ImportError as missing:  # a full unpickle's class needs torch (or is not here)
        raise HarnessError(
            f"Cannot read {path} without torch: unpickling it imports {missing.name}. The run "
            "reads it with torch; to plan it, extract the checkpoint first (python -m "
            "dflash_eval extract)."
        ) from None
    except (*DAMAGED, pickle.UnpicklingError) as error:
        raise HarnessError(unreadable(path, f"{type(error).__name__}: {error}")) from None


SHAPES_READER = TensorReader(TensorInfo, read_pickle, lambda file: read_header(file)[0])
