"""Drafter checkpoints (DFLASH.md §5): read any of the three formats, resolve the config,
and load strictly.

Formats:
- training checkpoint: a torch pickle (`checkpoint.pt`) holding `model_state_dict` (maybe
  prefixed `module.`/`draft_model.`, maybe bf16) plus optimizer state, step, config/args;
  read with `weights_only=True`, anything needing arbitrary unpickling is refused unless
  the user passes --allow-unsafe-pickle;
- Hugging Face directory: config.json + *.safetensors (z-lab's published format);
- extracted (this project's `extract`): model.safetensors + config.json + dflash_extract.json.

Strict means: every expected parameter present with its shape and nothing unexpected; any
mismatch stops the run with the names listed.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from dflash_eval.config import (
    DrafterConfig,
    TargetShape,
    complete,
    from_hf_dict,
    infer_from_shapes,
)
from dflash_eval.errors import HarnessError
from dflash_eval.model import DFlashDrafter, build_drafter, expected_shapes

EXTRACT_MARKER = "dflash_extract.json"
# Wrappers that training code puts in front of parameter names.
PREFIXES = ("module.", "_orig_mod.", "draft_model.", "drafter.", "model.")
# Frozen copies of the target's parts that some trainers store; the harness uses the
# target's own, so these are set aside (and reported), not loaded.
BORROWED = ("embed_tokens.weight", "lm_head.weight")
STATE_DICT_KEYS = ("model_state_dict", "state_dict", "model")
# Checkpoint entries read for identity/config; everything else (optimizer...) is dropped.
METADATA_KEYS = ("config", "model_config", "draft_config", "args", "step", "global_step")


@dataclass
class DrafterSource:
    """What a checkpoint holds, before any config decision."""

    path: Path
    kind: str  # "training-checkpoint" | "hf-directory" | "extracted"
    files: list[Path]  # the files read (for identity)
    state_dict: dict[str, torch.Tensor]
    config_dict: dict[str, Any] | None
    step: int | None
    step_source: str | None
    stripped_prefix: str = ""
    dropped_entries: list[str] = field(default_factory=list)  # optimizer etc., not loaded
    extra_hints: dict[str, Any] = field(default_factory=dict)  # block_size etc. from args


def read_drafter(path: Path, allow_unsafe_pickle: bool = False) -> DrafterSource:
    """Read a drafter checkpoint in any supported format (no config decisions yet)."""
    path = Path(path)
    if not path.exists():
        raise HarnessError(
            f"Drafter checkpoint {path} does not exist. Check the path (on the eval host) "
            "or stage the checkpoint first."
        )
    if path.is_dir():
        return _read_directory(path, allow_unsafe_pickle)
    return _read_training_checkpoint(path, allow_unsafe_pickle)


def _read_directory(path: Path, allow_unsafe_pickle: bool) -> DrafterSource:
    tensors_files = sorted(path.glob("*.safetensors"))
    if not tensors_files:
        pickles = sorted(path.glob("*.pt")) + sorted(path.glob("*.pth"))
        if len(pickles) == 1:
            return _read_training_checkpoint(pickles[0], allow_unsafe_pickle)
        raise HarnessError(
            f"Drafter directory {path} holds no *.safetensors file (and not exactly one "
            f"*.pt: found {[p.name for p in pickles]}). Expected a Hugging Face DFlash "
            "directory (config.json + model.safetensors), an extracted directory, or a "
            "training checkpoint.pt."
        )
    state_dict: dict[str, torch.Tensor] = {}
    for file in tensors_files:
        try:
            state_dict.update(load_file(str(file)))
        except Exception as error:  # safetensors raises its own untyped errors
            raise HarnessError(
                f"Cannot read {file} as safetensors ({error}). The file is probably "
                "truncated or not a safetensors file; re-copy it."
            ) from None
    marker = path / EXTRACT_MARKER
    provenance = json.loads(marker.read_text()) if marker.exists() else {}
    config_file = path / "config.json"
    config_dict = json.loads(config_file.read_text()) if config_file.exists() else None
    step = provenance.get("step")
    step_source = "extract provenance" if step is not None else None
    if step is None:
        step, step_source = _step_from_path(path)
    stripped, state_dict = strip_prefix(state_dict)
    return DrafterSource(
        path=path,
        kind="extracted" if marker.exists() else "hf-directory",
        files=[*tensors_files, *([config_file] if config_file.exists() else [])],
        state_dict=state_dict,
        config_dict=config_dict,
        step=step,
        step_source=step_source,
        stripped_prefix=stripped,
        extra_hints=provenance.get("hints", {}),
    )


def load_pickle(path: Path, allow_unsafe_pickle: bool) -> Any:
    """torch.load with weights_only=True; the refusal says what the file wanted."""
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:
            if "mmap" not in str(error):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        reason = _unpickling_reason(str(error))
        if not allow_unsafe_pickle:
            raise HarnessError(
                f"Refusing to load {path}: it is not a plain weights-only checkpoint "
                f"({reason}). Unpickling it would run code named inside the file, which "
                "can do anything on this host. If you trust where the file came from, "
                "re-run with --allow-unsafe-pickle; better, extract it once on a trusted "
                "machine (`python -m dflash_eval extract --allow-unsafe-pickle`)."
            ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as error:
        raise HarnessError(
            f"Cannot read {path} ({path.stat().st_size} bytes) as a torch checkpoint: "
            f"{error}. It is probably truncated or not a checkpoint; compare its size and "
            "hash with the source and re-stage it."
        ) from None
    return torch.load(path, map_location="cpu", weights_only=False)


def _unpickling_reason(message: str) -> str:
    for line in message.splitlines():
        if "Unsupported global" in line or "Unsupported operand" in line:
            reason = line.strip().removeprefix("WeightsUnpickler error: ")
            return reason.split(". Please use")[0]
    return message.splitlines()[0] if message else "unknown unpickling error"


def _read_training_checkpoint(path: Path, allow_unsafe_pickle: bool) -> DrafterSource:
    obj = load_pickle(path, allow_unsafe_pickle)
    if not isinstance(obj, dict):
        raise HarnessError(
            f"{path} unpickles to a {type(obj).__name__}, not a dict. Expected a training "
            "checkpoint dict with 'model_state_dict' (or a plain state dict)."
        )
    state_key = next((key for key in STATE_DICT_KEYS if isinstance(obj.get(key), dict)), None)
    if state_key is None and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        raw_state, dropped = obj, []
    elif state_key is None:
        raise HarnessError(
            f"{path} has no parameters under {list(STATE_DICT_KEYS)}; its top-level keys are "
            f"{sorted(obj)[:20]}. Expected a training checkpoint with 'model_state_dict'."
        )
    else:
        raw_state = obj[state_key]
        dropped = sorted(str(key) for key in obj if key not in {state_key, *METADATA_KEYS})
    not_tensors = [k for k, v in raw_state.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise HarnessError(
            f"The state dict in {path} has non-tensor entries: {not_tensors[:10]}. "
            "It is not a drafter state dict."
        )
    stripped, state_dict = strip_prefix(raw_state)
    step, step_source = _step_from_checkpoint(obj, path)
    return DrafterSource(
        path=path,
        kind="training-checkpoint",
        files=[path],
        state_dict=state_dict,
        config_dict=_config_from_checkpoint(obj),
        step=step,
        step_source=step_source,
        stripped_prefix=stripped,
        dropped_entries=dropped,
        extra_hints=_hints_from_args(obj.get("args")),
    )


def strip_prefix(state_dict: dict[str, torch.Tensor]) -> tuple[str, dict[str, torch.Tensor]]:
    """Remove wrapper prefixes shared by every name (repeatedly: `module.draft_model.`)."""
    stripped = ""
    while state_dict:
        prefix = next((p for p in PREFIXES if all(name.startswith(p) for name in state_dict)), None)
        if prefix is None:
            break
        stripped += prefix
        state_dict = {name[len(prefix) :]: value for name, value in state_dict.items()}
    return stripped, state_dict


def _as_plain(value: Any) -> Any:
    """A config/args object (from an unsafe pickle) as a plain dict."""
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return None
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "__dict__"):
        return dict(vars(value))
    return None


def _config_from_checkpoint(obj: dict[str, Any]) -> dict[str, Any] | None:
    for key in ("config", "model_config", "draft_config"):
        config = _as_plain(obj.get(key))
        if isinstance(config, dict) and "hidden_size" in config:
            return config
    return None


def _hints_from_args(args: Any) -> dict[str, Any]:
    """Training arguments that pin down what shapes cannot (block size, mask id)."""
    args = _as_plain(args) or {}
    return {k: args[k] for k in ("block_size", "mask_token_id") if args.get(k) is not None}


def _step_from_checkpoint(obj: dict[str, Any], path: Path) -> tuple[int | None, str | None]:
    for key in ("step", "global_step"):
        if isinstance(obj.get(key), int):
            return obj[key], f"checkpoint '{key}'"
    return _step_from_path(path)


def _step_from_path(path: Path) -> tuple[int | None, str | None]:
    match = re.search(r"(?:step|checkpoint)[_-]?(\d+)", str(path))
    return (int(match.group(1)), "path") if match else (None, None)


@dataclass
class LoadedDrafter:
    source: DrafterSource
    config: DrafterConfig
    config_source: str  # "checkpoint" | "file <path>" | "inferred from shapes + target"
    trained_block_size: int | None
    notes: list[str]
    warnings: list[str]
    ignored_parameters: list[str]
    model: DFlashDrafter


def load_drafter(
    path: Path,
    target: TargetShape,
    *,
    config_file: Path | None = None,
    block_size: int | None = None,
    mask_token_id: int | None = None,
    target_layer_ids: list[int] | None = None,
    allow_unsafe_pickle: bool = False,
    dtype: torch.dtype = torch.float32,
) -> LoadedDrafter:
    """Read, resolve the config (checkpoint → file/flags → inferred), check, load strictly."""
    source = read_drafter(path, allow_unsafe_pickle)
    notes: list[str] = []
    warnings: list[str] = []
    file_config = _read_config_file(config_file) if config_file else None
    if source.config_dict is not None:
        config = from_hf_dict(source.config_dict, f"checkpoint {path}")
        config_source = "checkpoint"
        if file_config is not None:
            _refuse_conflict(config, from_hf_dict(file_config, str(config_file)), path, config_file)
    elif file_config is not None:
        config = from_hf_dict(file_config, f"--drafter-config {config_file}")
        config_source = f"file {config_file}"
    else:
        shapes = {name: tuple(t.shape) for name, t in source.state_dict.items()}
        config = infer_from_shapes(shapes, target)
        config_source = "inferred from parameter shapes + target config"
    trained_block_size = config.block_size or source.extra_hints.get("block_size")
    if not config.block_size and trained_block_size:
        notes.append(f"block_size {trained_block_size} from the checkpoint's training args")
    hint_mask = source.extra_hints.get("mask_token_id")
    if mask_token_id is None and config.mask_token_id < 0 and hint_mask is not None:
        mask_token_id = int(hint_mask)
    if block_size is not None and trained_block_size and block_size != trained_block_size:
        warnings.append(
            f"--block-size {block_size} differs from the block size the drafter was trained "
            f"with ({trained_block_size}); τ will not be comparable with other runs"
        )
    if (
        mask_token_id is not None
        and config.mask_token_id >= 0
        and mask_token_id != config.mask_token_id
    ):
        warnings.append(
            f"--mask-token-id {mask_token_id} overrides the checkpoint config's "
            f"{config.mask_token_id}; the drafter was trained with the latter"
        )
    overridden_ids = tuple(target_layer_ids or ())
    if overridden_ids and config.target_layer_ids and overridden_ids != config.target_layer_ids:
        warnings.append(
            f"--target-layer-ids {list(overridden_ids)} overrides the checkpoint config's "
            f"{list(config.target_layer_ids)}; the drafter was trained with the latter"
        )
    fc = source.state_dict.get("fc.weight")
    hint = fc.shape[1] // fc.shape[0] if fc is not None and fc.ndim == 2 else None
    config, filled = complete(
        config,
        target,
        block_size=block_size if block_size is not None else trained_block_size,
        mask_token_id=mask_token_id,
        target_layer_ids=target_layer_ids,
        where=f"{config_source} ({path})",
        layer_count_hint=hint,
    )
    notes += filled
    ignored = check_parameters(source.state_dict, config, path)
    model = build_drafter(config, dtype)
    wanted = {k: v for k, v in source.state_dict.items() if k not in ignored}
    model.load_state_dict({k: v.to(dtype) for k, v in wanted.items()}, strict=True)
    return LoadedDrafter(
        source=source,
        config=config,
        config_source=config_source,
        trained_block_size=int(trained_block_size) if trained_block_size else None,
        notes=notes,
        warnings=warnings,
        ignored_parameters=ignored,
        model=model,
    )


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise HarnessError(f"Cannot read drafter config {path}: {error}.") from None


def _refuse_conflict(
    from_checkpoint: DrafterConfig, from_file: DrafterConfig, path: Path, file: Path
) -> None:
    ours, theirs = vars(from_checkpoint), vars(from_file)
    differing = [k for k in ours if theirs[k] != ours[k] and theirs[k] not in (None, (), 0, -1)]
    if differing:
        details = ", ".join(f"{k}: checkpoint {ours[k]} vs file {theirs[k]}" for k in differing)
        raise HarnessError(
            f"The config inside {path} and --drafter-config {file} disagree ({details}). "
            "The checkpoint's own config is authoritative; drop --drafter-config or fix it."
        )


def check_parameters(
    state_dict: dict[str, torch.Tensor], config: DrafterConfig, path: Path
) -> list[str]:
    """Strict name/shape check. Returns the borrowed names set aside; raises on mismatch."""
    ignored = sorted(
        name for name in state_dict if name in BORROWED or name.endswith("rotary_emb.inv_freq")
    )
    found = {name: tuple(t.shape) for name, t in state_dict.items() if name not in ignored}
    expected = expected_shapes(config)
    fc_shape = found.get("fc.weight")
    fc_inputs = len(config.target_layer_ids) * config.hidden_size
    if fc_shape is not None and len(fc_shape) == 2 and fc_shape[1] != fc_inputs:
        raise HarnessError(
            f"fc.weight in {path} takes {fc_shape[1]} input features, but the config says "
            f"K={len(config.target_layer_ids)} target layers {list(config.target_layer_ids)} × "
            f"hidden {config.hidden_size} = {fc_inputs}. The drafter was trained with a "
            "different set of target layers: pass the right --target-layer-ids or the "
            "drafter's own config (--drafter-config)."
        )
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    misshaped = [
        f"{name} (expected {list(expected[name])}, found {list(found[name])})"
        for name in sorted(set(expected) & set(found))
        if expected[name] != found[name]
    ]
    if missing or unexpected or misshaped:
        parts = []
        for label, names in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("mis-shaped", misshaped),
        ):
            if names:
                shown = ", ".join(names[:15])
                more = f" … and {len(names) - 15} more" if len(names) > 15 else ""
                parts.append(f"{label} ({len(names)}): {shown}{more}")
        raise HarnessError(
            f"The parameters in {path} do not match the drafter config "
            f"({config.num_hidden_layers} layers, hidden {config.hidden_size}, "
            f"{config.num_attention_heads}/{config.num_key_value_heads} heads × "
            f"{config.head_dim}): " + "; ".join(parts) + ". The checkpoint and the config "
            "describe different architectures; pass the drafter's own config "
            "(--drafter-config) or check that this is a DFlash drafter checkpoint."
        )
    return ignored
