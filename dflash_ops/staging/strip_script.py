"""The trainer side of `stage-checkpoint --weights-only`: a training checkpoint's drafter
weights → the eval harness's "extracted" format, written where the checkpoint lives.

Shipped as the text of this file and run in the training environment, with that
environment's own python, torch and safetensors (nothing else beyond the stdlib):

    python3 -c SOURCE KEYS_JSON CHECKPOINT OUT_DIR

writes OUT_DIR/model.safetensors, OUT_DIR/config.json (when the checkpoint carries a config)
and OUT_DIR/dflash_extract.json (provenance: the source's size, mtime and sha256, the step),
then prints one JSON line describing them (name, size, sha256 of each file). The outputs get
the checkpoint's mtime and no wall-clock time, so extracting the same checkpoint twice gives
the same bytes (an interrupted copy of them can resume).

The checkpoint is memory-mapped (`torch.load(mmap=True, weights_only=True)`): tensors go from
the page cache to the output file, they are not copied into this process's memory, so the
extraction does not compete with training for RAM. KEYS_JSON carries the harness's own lists
of where a state dict lives, which entries are metadata and which name prefixes are wrappers
(`dflash_eval.contract.weights`: one source of truth for what the weights are).

Exit 3: this environment cannot extract (no torch or safetensors, a torch that cannot
memory-map, a checkpoint in torch's legacy format): the reason is on stderr and the caller
falls back to copying the whole checkpoint. Any other failure exits 1 with the reason.
Python 3.8 or later (what training images ship).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time

UNUSABLE = 3
CONFIG_KEYS = ("config", "model_config", "draft_config")
HINT_KEYS = ("block_size", "mask_token_id")
STEP_KEYS = ("step", "global_step")
SPACE_MARGIN = 64 << 20  # beyond the weights themselves, in OUT_DIR


class Refused(Exception):
    """A failure with its exit code; the message goes to stderr."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def plain(value):
    """A config/args entry as a dict (a JSON string is parsed), else None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def load(torch, checkpoint: str):
    try:
        return torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    except TypeError as error:  # a torch from before memory-mapped loading
        raise Refused(f"torch {torch.__version__} cannot memory-map ({error})", UNUSABLE) from None
    except RuntimeError as error:
        if "mmap" in str(error):  # legacy (non-zip) format: mmap is impossible
            raise Refused(f"cannot memory-map {checkpoint}: {error}", UNUSABLE) from None
        raise Refused(f"cannot read {checkpoint}: {str(error).splitlines()[0]}") from None
    except Exception as error:  # weights_only refused a pickle, a truncated file, …
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise Refused(
            f"cannot load {checkpoint} weights-only ({first}); stage it without "
            "--weights-only and extract it where you trust it"
        ) from None


def state_dict_of(torch, checkpoint: dict, keys: dict) -> tuple[dict, list[str]]:
    """The parameters, and the entries dropped (optimizer, scheduler, …)."""
    state_key = next(
        (k for k in keys["state_dict_keys"] if isinstance(checkpoint.get(k), dict)), None
    )
    if state_key is None:
        if checkpoint and all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
            return checkpoint, []
        raise Refused(
            f"no parameters under {list(keys['state_dict_keys'])}; top-level keys: "
            f"{sorted(map(str, checkpoint))[:20]}"
        )
    kept = {state_key, *keys["metadata_keys"]}
    state = checkpoint[state_key]
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise Refused(f"the state dict under {state_key!r} has non-tensor entries")
    return state, sorted(str(k) for k in checkpoint if k not in kept)


def strip_prefix(state: dict, prefixes: list[str]) -> tuple[str, dict]:
    """Remove wrapper prefixes shared by every name (repeatedly), as the harness does."""
    stripped = ""
    while state:
        prefix = next((p for p in prefixes if all(name.startswith(p) for name in state)), None)
        if prefix is None:
            break
        stripped += prefix
        state = {name[len(prefix) :]: value for name, value in state.items()}
    return stripped, state


def provenance(checkpoint: dict, path: str, before: os.stat_result, stripped: str, dropped) -> dict:
    step, step_source = None, None
    for key in STEP_KEYS:
        if isinstance(checkpoint.get(key), int):
            step, step_source = checkpoint[key], f"checkpoint '{key}'"
            break
    args = plain(checkpoint.get("args")) or {}
    return {
        "source": path,
        "source_size_bytes": before.st_size,
        "source_sha256": None,  # filled in once the whole file was read
        "step": step,
        "step_source": step_source,
        "stripped_prefix": stripped,
        "dropped_entries": dropped,
        "hints": {k: args[k] for k in HINT_KEYS if args.get(k) is not None},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(before.st_mtime)),
        "extracted_on": "trainer",
    }


def config_of(checkpoint: dict):
    for key in CONFIG_KEYS:
        config = plain(checkpoint.get(key))
        if config is not None and "hidden_size" in config:
            return config
    return None


def write_tensors(save_file, state: dict, out_dir: str) -> int:
    """model.safetensors from the (memory-mapped) tensors; returns the weights' bytes."""
    tensors = {name: t.contiguous() for name, t in state.items()}
    seen = set()
    for name, tensor in tensors.items():  # safetensors refuses shared storage: clone those
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in seen:
            tensors[name] = tensor.clone()
        seen.add(pointer)
    weights = sum(t.numel() * t.element_size() for t in tensors.values())
    free = shutil.disk_usage(out_dir).free
    if free < weights + SPACE_MARGIN:
        raise Refused(
            f"not enough space in {out_dir} for the weights: need {weights + SPACE_MARGIN} "
            f"bytes, free {free}; point TMPDIR in the training environment at a larger disk"
        )
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    return weights


def extract(keys: dict, path: str, out_dir: str) -> dict:
    try:
        import torch
        from safetensors.torch import save_file
    except ImportError as error:
        raise Refused(f"{error} (with {sys.executable})", UNUSABLE) from None
    before = os.stat(path)
    checkpoint = load(torch, path)
    if not isinstance(checkpoint, dict):
        raise Refused(f"{path} holds a {type(checkpoint).__name__}, not a checkpoint dict")
    state, dropped = state_dict_of(torch, checkpoint, keys)
    stripped, state = strip_prefix(state, keys["prefixes"])
    weights = write_tensors(save_file, state, out_dir)
    config = config_of(checkpoint)
    if config is not None:
        with open(os.path.join(out_dir, "config.json"), "w") as file:
            file.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    record = provenance(checkpoint, path, before, stripped, dropped)
    record["source_sha256"] = sha256_of(path)
    after = os.stat(path)
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise Refused(f"{path} changed while it was extracted; wait until it is written")
    with open(os.path.join(out_dir, keys["marker"]), "w") as file:
        file.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
    files = []
    for name in sorted(os.listdir(out_dir)):
        file_path = os.path.join(out_dir, name)
        os.utime(file_path, (before.st_mtime, before.st_mtime))
        files.append(
            {"name": name, "size": os.path.getsize(file_path), "sha256": sha256_of(file_path)}
        )
    return {
        "files": files,
        "mtime": int(before.st_mtime),
        "source_size": before.st_size,
        "source_sha256": record["source_sha256"],
        "weights_bytes": weights,
        "dropped_entries": dropped,
        "torch": torch.__version__,
    }


def main(argv: list[str]) -> int:
    keys, path, out_dir = json.loads(argv[1]), argv[2], argv[3]
    try:
        summary = extract(keys, path, out_dir)
    except Refused as refusal:
        sys.stderr.write(f"dflash-strip: {refusal}\n")
        return refusal.code
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
