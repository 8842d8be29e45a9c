"""A checkpoint's tensors read with torch, as the run reads them (checkpoint.TensorReader):
pickles through `torch.load(weights_only=True)` under the pickle policy (pickle_policy.py),
memory-mapped, once the shape reader has found every tensor inside the bytes stored for it
(torch does not check that of a mapped file); safetensors files whole."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from dflash_eval.contract.errors import HarnessError
from dflash_eval.drafter.checkpoint import TensorReader
from dflash_eval.drafter.pickle_policy import (
    DAMAGED,
    FULL_UNPICKLE,
    PicklePolicy,
    PickleRecord,
    admitted_objects,
    no_pickle_opcode,
    refusal,
    start_record,
    unreadable,
)
from dflash_eval.drafter.shape_reader import storage_overrun


def load_pickle(path: Path, policy: PicklePolicy) -> tuple[Any, PickleRecord]:
    """torch.load under the policy; a refusal says what the file wanted and how to allow it."""
    names, record = start_record(policy)
    record.file_globals = _file_globals(path)
    overrun = storage_overrun(path, policy)
    if overrun is not None:
        raise HarnessError(unreadable(path, overrun))
    try:
        with torch.serialization.safe_globals(admitted_objects(names)):
            return _weights_only_load(path), record
    except pickle.UnpicklingError as error:
        not_pickle = no_pickle_opcode(str(error))
        if not_pickle is not None:
            raise HarnessError(unreadable(path, not_pickle)) from None
        if not policy.allow_unsafe:
            raise HarnessError(refusal(path, str(error), record.file_globals)) from None
    except DAMAGED as error:
        raise HarnessError(unreadable(path, f"{type(error).__name__}: {error}")) from None
    record.loaded_with = FULL_UNPICKLE
    return torch.load(path, map_location="cpu", weights_only=False), record


def _weights_only_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as error:
        if "mmap" not in str(error):
            raise
        # The legacy (non-zip) format cannot be memory-mapped.
        return torch.load(path, map_location="cpu", weights_only=True)


def _file_globals(path: Path) -> list[str] | None:
    """The globals a zip-format checkpoint names beyond torch's own, read without running
    anything; None for the legacy format or an unreadable file."""
    try:
        return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:  # legacy format, truncated file: the load itself reports those
        return None


TORCH_READER = TensorReader(torch.Tensor, load_pickle, lambda file: load_file(str(file)))
