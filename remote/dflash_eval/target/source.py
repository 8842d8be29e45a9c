"""The target as one run needs it: its config, shape, dtype and kernels at once; the whole
model only when something must be computed with it; otherwise just its embedding and head.

The dtype is chosen before anything is loaded (dtype.choose_target_dtype), so the cache
keys of completions and hidden states are known without the model, and a run whose every
entry is cached never reads the target's body.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.options import DEFAULT_DEVICE
from dflash_eval.contract.progress import Progress, Timer
from dflash_eval.target.config import TargetShape, read_target_config
from dflash_eval.target.dtype import DtypeChoice, available_memory_bytes, choose_target_dtype
from dflash_eval.target.features import kernel_record
from dflash_eval.target.files import load_tokenizer, stop_token_ids, target_identity, weight_bytes
from dflash_eval.target.model import DTYPES, Target, load_target
from dflash_eval.target.parts import TargetParts, load_target_parts
from dflash_eval.target.placement import Shard


def visible_gpus(cap_bytes: int | None) -> Shard:
    """Every CUDA device this process sees, in order, each holding at most `cap_bytes`."""
    return Shard(tuple(f"cuda:{i}" for i in range(torch.cuda.device_count())), cap_bytes)


def _available_bytes(device: str, shard: Shard | None) -> int | None:
    """Host memory on CPU; on CUDA the free memory of the GPU(s) the target goes to."""
    if device != "cuda":
        return available_memory_bytes()
    devices = shard.devices if shard is not None else ("cuda",)
    return sum(torch.cuda.mem_get_info(torch.device(name))[0] for name in devices)


class TargetSource:
    def __init__(
        self,
        path: Path,
        requested_dtype: str,
        timer: Timer,
        progress: Progress,
        device: str = DEFAULT_DEVICE,
        shard: Shard | None = None,
    ) -> None:
        self.path = Path(path)
        self.device = device
        self.shard = shard
        self.config = read_target_config(self.path)
        self.shape: TargetShape = self.config.shape
        self.context = self.config.max_positions  # positions it was trained on (or None)
        self.family = self.config.family
        # What a float32 copy for the fidelity check must fit in: host or GPU memory.
        self.available_bytes = _available_bytes(device, shard)
        self.dtype_choice: DtypeChoice = choose_target_dtype(
            requested_dtype,
            self.config.saved_dtype,
            self.config,
            weight_bytes(self.path),
            self.available_bytes,
            device,
        )
        self.kernel = kernel_record(self.config)
        self._timer, self._progress = timer, progress
        self._target: Target | None = None
        self._parts: TargetParts | None = None

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_choice.name]

    # What a run reads of the target besides its weights, each read once, when first asked for.
    @cached_property
    def tokenizer(self) -> Any:
        return load_tokenizer(self.path)

    @cached_property
    def stops(self) -> list[int]:
        return stop_token_ids(self.path, self.tokenizer)

    @cached_property
    def identity(self) -> dict[str, Any]:
        return target_identity(self.path)

    def target(self) -> Target:
        """The whole model, loaded on first use."""
        if self._target is None:
            with self._timer.phase("load_target"):
                self._progress.status(f"Loading target {self.path} ({self.dtype_choice.name}) …")
                self._target = load_target(
                    self.path, self.dtype_choice.name, self.device, self.config, self.shard
                )
            if self._target.shape != self.shape:
                raise HarnessError(
                    f"Target {self.path}: the loaded model's shape {self._target.shape} differs "
                    f"from its config's {self.shape}; the config does not describe the weights."
                )
        return self._target

    def kernels_run(self, tokens: list[int], layer_ids: list[int]) -> dict[str, Any]:
        """The kernels the target's feature forward ran, seen during its first forward (one
        more forward over `tokens` when none has run yet)."""
        target = self.target()
        if target.kernels_run is None:
            target.hidden_features(tokens, layer_ids)
        return dict(target.kernels_run or {})

    def placement_record(self) -> dict[str, Any] | None:
        """How the loaded target is split over devices (None: on one device)."""
        placement = self._target.placement if self._target is not None else None
        return placement.record() if placement is not None else None

    def release_body(self) -> None:
        if self._target is not None and self._target.model is not None:
            self._target.release_body()

    def embedding_and_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        """From the loaded model when there is one, else read alone from the weight files."""
        if self._target is not None:
            return self._target.embed_weight, self._target.head_weight
        if self._parts is None:
            with self._timer.phase("load_target"):
                self._parts = load_target_parts(self.path, self.config, self.dtype)
        return self._parts.embed_weight, self._parts.head_weight

    def load_record(self) -> dict[str, Any]:
        """What was read of the target: the whole model, or only the named tensors."""
        if self._target is not None:
            return {"body_loaded": True, "tensors_read": "all"}
        read = self._parts.tensors_read if self._parts else []
        return {"body_loaded": False, "tensors_read": read}
