"""`extract`: a training checkpoint → its parameters as safetensors + the config JSON.

Optimizer and scheduler state (typically ~2/3 of a training checkpoint) are dropped. The
output directory is this project's "extracted" format, which the loaders read back:
model.safetensors, config.json (when the checkpoint carries a config) and
dflash_extract.json (provenance: source path, size, sha256, step, what was dropped).
An existing output directory is replaced only when that record says extract wrote it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.weights import EXTRACT_MARKER
from dflash_eval.drafter.checkpoint import read_drafter
from dflash_eval.drafter.config import from_hf_dict
from dflash_eval.drafter.pickle_policy import PicklePolicy
from dflash_eval.drafter.torch_reader import TORCH_READER
from dflash_eval.run.own_dirs import promote, start_partial
from dflash_eval.run.results import file_identity, utc_now


def extract(
    checkpoint: Path,
    out_dir: Path,
    pickle_policy: PicklePolicy | None = None,
    config_file: Path | None = None,
) -> dict[str, Any]:
    """Write the extracted form of `checkpoint` into `out_dir`; return a summary."""
    source = read_drafter(checkpoint, TORCH_READER, pickle_policy)
    if source.kind != "training-checkpoint":
        raise HarnessError(
            f"{checkpoint} is already a {source.kind} (safetensors); there is no optimizer "
            "state to strip. Use it as it is."
        )
    config = source.config_dict
    if config is None and config_file is not None:
        config = json.loads(Path(config_file).read_text())
    if config is not None:
        # Refuse a config we cannot use; unknown keys are for the evaluation (and the
        # profile's accept_keys) to judge.
        from_hf_dict(config, f"checkpoint {checkpoint}", accept_keys=None)
    out_dir = Path(out_dir)
    partial = start_partial(out_dir, EXTRACT_MARKER, "extract")
    tensors = save_tensors(source.state_dict, partial / "model.safetensors")
    if config is not None:
        (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    identity = file_identity([Path(checkpoint)])
    provenance = {
        "source": str(checkpoint),
        "source_size_bytes": identity["size_bytes"],
        "source_sha256": identity["sha256"],
        "step": source.step,
        "step_source": source.step_source,
        "stripped_prefix": source.stripped_prefix,
        "dropped_entries": source.dropped_entries,
        "hints": source.extra_hints,
        "pickle": source.pickle.to_dict() if source.pickle else None,
        "created_at": utc_now(),
    }
    (partial / EXTRACT_MARKER).write_text(json.dumps(provenance, indent=2) + "\n")
    promote(partial, out_dir, EXTRACT_MARKER, "extract")
    size_after = sum(f.stat().st_size for f in out_dir.iterdir())
    return {
        "out": str(out_dir),
        "size_before_bytes": identity["size_bytes"],
        "size_after_bytes": size_after,
        "parameters": len(tensors),
        "step": source.step,
        "config_written": config is not None,
        "dropped_entries": source.dropped_entries,
    }


def save_tensors(state_dict: dict[str, torch.Tensor], file: Path) -> dict[str, torch.Tensor]:
    """Write `state_dict` as safetensors (what z-lab publishes); return what was written."""
    tensors = {name: t.contiguous() for name, t in state_dict.items()}
    # safetensors refuses tensors that share storage; clone those.
    seen: set[int] = set()
    for name, tensor in tensors.items():
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in seen:
            tensors[name] = tensor.clone()
        seen.add(pointer)
    save_file(tensors, str(file), metadata={"format": "pt"})
    return tensors
