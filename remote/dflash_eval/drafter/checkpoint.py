"""Drafter checkpoints (dflash-spec.md §5) as read, in any of the three formats, before any
config decision (settings.py makes those; loaders.py builds and loads the drafter).

Formats:
- training checkpoint: a torch pickle (`checkpoint.pt`) holding `model_state_dict` (maybe
  prefixed `module.`/`draft_model.`, maybe bf16) plus optimizer state, step, config/args;
  read under the pickle policy (pickle_policy.py: weights only, plus globals the user
  names; arbitrary unpickling only with --allow-unsafe-pickle);
- Hugging Face directory: config.json + *.safetensors (z-lab's published format);
- extracted (this project's `extract`): model.safetensors + config.json + dflash_extract.json.
Where the weights are in each is contract/weights.py's.

How the tensors themselves are read is the caller's `TensorReader`: with torch for a run
(torch_reader.py), or as names, shapes and dtypes without torch for a dry run
(shape_reader.py). Everything else here is the same for both, so the dry run finds what the
run finds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.weights import EXTRACT_MARKER, METADATA_KEYS, PREFIXES, STATE_DICT_KEYS
from dflash_eval.drafter.pickle_policy import PicklePolicy, PickleRecord
from dflash_eval.drafter.profile import NameRules


@dataclass(frozen=True)
class TensorReader:
    """How a checkpoint's tensors are read."""

    tensor_type: type  # what a state dict's values are
    read_pickle: Callable[[Path, PicklePolicy], tuple[Any, PickleRecord]]
    read_safetensors: Callable[[Path], dict[str, Any]]


@dataclass
class DrafterSource:
    """What a checkpoint holds, before any config decision."""

    path: Path
    kind: str  # "training-checkpoint" | "hf-directory" | "extracted"
    files: list[Path]  # the files read (for identity)
    state_dict: dict[str, Any]  # name → the reader's tensor
    config_dict: dict[str, Any] | None
    step: int | None
    step_source: str | None
    stripped_prefix: str = ""
    dropped_entries: list[str] = field(default_factory=list)  # optimizer etc., not loaded
    # Training arguments (block_size, mask_token_id…), from `args` or the extract record.
    extra_hints: dict[str, Any] = field(default_factory=dict)
    pickle: PickleRecord | None = None  # how a pickled file was read (None: safetensors)
    renamed_parameters: int = 0  # names changed by the profile's parameter_renames


def read_drafter(
    path: Path,
    reader: TensorReader,
    policy: PicklePolicy | None = None,
    names: NameRules | None = None,
) -> DrafterSource:
    """Read a drafter checkpoint in any supported format (no config decisions yet)."""
    path = Path(path)
    policy = policy or PicklePolicy()
    if not path.exists():
        raise HarnessError(
            f"Drafter checkpoint {path} does not exist. Check the path (on the eval host) "
            "or stage the checkpoint first."
        )
    source = (
        _read_directory(path, reader, policy)
        if path.is_dir()
        else _read_pickle(path, reader, policy)
    )
    source.stripped_prefix, source.renamed_parameters, source.state_dict = apply_name_rules(
        source.state_dict, names or NameRules(), path
    )
    return source


def _read_directory(path: Path, reader: TensorReader, policy: PicklePolicy) -> DrafterSource:
    tensors_files = sorted(path.glob("*.safetensors"))
    if not tensors_files:
        pickles = sorted(path.glob("*.pt")) + sorted(path.glob("*.pth"))
        if len(pickles) == 1:
            return _read_pickle(pickles[0], reader, policy)
        raise HarnessError(
            f"Drafter directory {path} holds no *.safetensors file (and not exactly one "
            f"*.pt: found {[p.name for p in pickles]}). Expected a Hugging Face DFlash "
            "directory (config.json + model.safetensors), an extracted directory, or a "
            "training checkpoint.pt."
        )
    state_dict: dict[str, Any] = {}
    for file in tensors_files:
        try:
            state_dict.update(reader.read_safetensors(file))
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
    return DrafterSource(
        path=path,
        kind="extracted" if marker.exists() else "hf-directory",
        files=[*tensors_files, *([config_file] if config_file.exists() else [])],
        state_dict=state_dict,
        config_dict=config_dict,
        step=step,
        step_source=step_source,
        extra_hints=provenance.get("hints", {}),
    )


def _read_pickle(path: Path, reader: TensorReader, policy: PicklePolicy) -> DrafterSource:
    obj, record = reader.read_pickle(path, policy)
    if not isinstance(obj, dict):
        raise HarnessError(
            f"{path} unpickles to a {type(obj).__name__}, not a dict. Expected a training "
            "checkpoint dict with 'model_state_dict' (or a plain state dict)."
        )
    state_key = next((key for key in STATE_DICT_KEYS if isinstance(obj.get(key), dict)), None)
    if state_key is None and obj and all(isinstance(v, reader.tensor_type) for v in obj.values()):
        raw_state, dropped = obj, []
    elif state_key is None:
        raise HarnessError(
            f"{path} has no parameters under {list(STATE_DICT_KEYS)}; its top-level keys are "
            f"{sorted(obj)[:20]}. Expected a training checkpoint with 'model_state_dict'."
        )
    else:
        raw_state = obj[state_key]
        dropped = sorted(str(key) for key in obj if key not in {state_key, *METADATA_KEYS})
    not_tensors = [k for k, v in raw_state.items() if not isinstance(v, reader.tensor_type)]
    if not_tensors:
        raise HarnessError(
            f"The state dict in {path} has non-tensor entries: {not_tensors[:10]}. "
            "It is not a drafter state dict."
        )
    step, step_source = _step_from_checkpoint(obj, path)
    return DrafterSource(
        path=path,
        kind="training-checkpoint",
        files=[path],
        state_dict=raw_state,
        config_dict=_config_from_checkpoint(obj),
        step=step,
        step_source=step_source,
        dropped_entries=dropped,
        extra_hints=_hints_from_args(obj.get("args")),
        pickle=record,
    )


def apply_name_rules(
    state_dict: dict[str, Any], rules: NameRules, path: Path
) -> tuple[str, int, dict[str, Any]]:
    """A profile's prefix (when the names carry it), the usual wrapper prefixes, then the
    profile's renames. Returns (prefix stripped, names renamed, state dict)."""
    stripped = ""
    if rules.prefix:
        carrying = [name for name in state_dict if name.startswith(rules.prefix)]
        if carrying and len(carrying) != len(state_dict):
            others = sorted(set(state_dict) - set(carrying))[:5]
            raise HarnessError(
                f"The profile's parameter_prefix {rules.prefix!r} is on only {len(carrying)} of "
                f"the {len(state_dict)} parameter names in {path} (not on e.g. {others}). Fix "
                "the profile's parameter_prefix."
            )
        if carrying:
            stripped = rules.prefix
            state_dict = {name[len(stripped) :]: t for name, t in state_dict.items()}
    wrappers, state_dict = strip_prefix(state_dict)
    renamed: dict[str, Any] = {}
    count = 0
    for name, tensor in state_dict.items():
        new_name = name
        for pattern, replacement in rules.renames:
            new_name = re.sub(pattern, replacement, new_name)
        if new_name in renamed:
            raise HarnessError(
                f"The profile's parameter_renames map two parameters of {path} to {new_name!r}. "
                "Fix the rename patterns."
            )
        count += new_name != name
        renamed[new_name] = tensor
    return stripped + wrappers, count, renamed


def strip_prefix(state_dict: dict[str, Any]) -> tuple[str, dict[str, Any]]:
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


TRAINING_ARG_KEYS = ("block_size", "mask_token_id", "target_layer_ids", "num_target_layers")


def _hints_from_args(args: Any) -> dict[str, Any]:
    """Training arguments that pin down what shapes cannot (block size, mask id, layers)."""
    args = _as_plain(args) or {}
    return {k: args[k] for k in TRAINING_ARG_KEYS if args.get(k) is not None}


def _step_from_checkpoint(obj: dict[str, Any], path: Path) -> tuple[int | None, str | None]:
    for key in ("step", "global_step"):
        if isinstance(obj.get(key), int):
            return obj[key], f"checkpoint '{key}'"
    return _step_from_path(path)


def _step_from_path(path: Path) -> tuple[int | None, str | None]:
    match = re.search(r"(?:step|checkpoint)[_-]?(\d+)", str(path))
    return (int(match.group(1)), "path") if match else (None, None)
