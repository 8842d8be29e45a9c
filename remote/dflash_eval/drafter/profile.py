"""Drafter profiles (`--drafter-profile FILE.json`): what is known about a trainer's
checkpoints beyond the checkpoint itself, as the workstation sends it from the inventory.

A profile is one JSON object; every key is optional, unknown keys are refused (a typo must
not silently drop a setting):

    {
      "name": "specforge-qwen3-8b",            # recorded with the results
      "block_size": 16,
      "target_layer_ids": [1, 9, 17, 25, 33],
      "mask_token_id": 151669,
      "num_target_layers": 36,
      "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000, "factor": 4.0,
                          "original_max_position_embeddings": 32768},
      "dtype": "bfloat16",                     # drafter dtype for the evaluation
      "config": {... a DFlash config.json ...},# the architecture, when checkpoints carry none
      "parameter_prefix": "model.draft.",      # stripped from parameter names when present
      "parameter_renames": [["\\.attn\\.", ".self_attn."]],  # regex → replacement, in order
      "accept_default": ["target_layer_ids"],  # confirm these default rules
      "accept_keys": ["draft_vocab_size"],     # config keys known to change nothing
                                               # (contract/config_keys.py; "dflash_config.KEY")
      "safe_globals": ["argparse", "numpy"]    # pickle policy (see pickle_policy.py)
    }

Settings from a profile have the source "profile" (see provenance.py). A profile cannot
allow unsafe unpickling: that takes the explicit --allow-unsafe-pickle flag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError

DTYPE_NAMES = ("float32", "bfloat16")
SETTING_KEYS = (
    "block_size",
    "target_layer_ids",
    "mask_token_id",
    "num_target_layers",
    "rope_parameters",
    "dtype",
)
OTHER_KEYS = (
    "name",
    "config",
    "parameter_prefix",
    "parameter_renames",
    "accept_default",
    "accept_keys",
    "safe_globals",
)


@dataclass(frozen=True)
class NameRules:
    """How stored parameter names map to the harness's: a prefix to strip, then regex
    renames applied in order (after the usual wrapper prefixes are removed)."""

    prefix: str = ""
    renames: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class DrafterProfile:
    path: Path
    name: str | None
    settings: Mapping[str, Any]  # typed: ints, tuple of ints, rope_parameters dict, dtype name
    config: Mapping[str, Any] | None
    names: NameRules = field(default_factory=NameRules)
    accept_default: tuple[str, ...] = ()
    accept_keys: tuple[str, ...] = ()
    safe_globals: tuple[str, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"profile {self.name or self.path}"

    def record(self) -> dict[str, Any]:
        """For the results: where it was read and everything it said."""
        return {"path": str(self.path), "name": self.name, "content": dict(self.raw)}


def read_profile(path: Path) -> DrafterProfile:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise HarnessError(f"Cannot read drafter profile {path}: {error}.") from None
    if not isinstance(raw, dict):
        kind = type(raw).__name__
        raise HarnessError(f"Drafter profile {path} must be a JSON object, got a {kind}.")
    unknown = sorted(set(raw) - set(SETTING_KEYS) - set(OTHER_KEYS))
    if unknown:
        raise HarnessError(
            f"Drafter profile {path} has unknown keys {unknown}; known: "
            f"{', '.join(SETTING_KEYS + OTHER_KEYS)}. Fix the spelling (an ignored key would "
            "silently leave its setting to another source)."
        )
    return DrafterProfile(
        path=path,
        name=_typed(raw, "name", str, path),
        settings=_settings(raw, path),
        config=_typed(raw, "config", dict, path),
        names=NameRules(
            prefix=_typed(raw, "parameter_prefix", str, path) or "",
            renames=_renames(raw.get("parameter_renames"), path),
        ),
        accept_default=tuple(_string_list(raw, "accept_default", path)),
        accept_keys=tuple(_string_list(raw, "accept_keys", path)),
        safe_globals=tuple(_string_list(raw, "safe_globals", path)),
        raw=raw,
    )


def _settings(raw: Mapping[str, Any], path: Path) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for key in ("block_size", "mask_token_id", "num_target_layers"):
        value = _typed(raw, key, int, path)
        if value is not None:
            settings[key] = value
    if raw.get("target_layer_ids") is not None:
        ids = raw["target_layer_ids"]
        if not isinstance(ids, list) or not all(_is_int(i) for i in ids) or not ids:
            _bad(path, "target_layer_ids", "a non-empty list of integers", ids)
        settings["target_layer_ids"] = tuple(ids)
    rope = _typed(raw, "rope_parameters", dict, path)
    if rope is not None:
        settings["rope_parameters"] = rope
    dtype = _typed(raw, "dtype", str, path)
    if dtype is not None:
        if dtype not in DTYPE_NAMES:
            _bad(path, "dtype", f"one of {DTYPE_NAMES}", dtype)
        settings["dtype"] = dtype
    return settings


def _renames(value: Any, path: Path) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    pairs = list(value.items()) if isinstance(value, dict) else value
    if not isinstance(pairs, list) or not all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(s, str) for s in p)
        for p in pairs
    ):
        _bad(path, "parameter_renames", "a list of [regex, replacement] pairs", value)
    for pattern, _ in pairs:
        try:
            re.compile(pattern)
        except re.error as error:
            _bad(path, "parameter_renames", f"valid regular expressions ({error})", pattern)
    return tuple((pattern, replacement) for pattern, replacement in pairs)


def _typed(raw: Mapping[str, Any], key: str, kind: type, path: Path) -> Any:
    value = raw.get(key)
    if value is None:
        return None
    valid = _is_int(value) if kind is int else isinstance(value, kind)
    if not valid:
        _bad(path, key, f"a {kind.__name__}", value)
    return value


def _string_list(raw: Mapping[str, Any], key: str, path: Path) -> list[str]:
    value = raw.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _bad(path, key, "a list of strings", value)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad(path: Path, key: str, expected: str, found: Any) -> None:
    raise HarnessError(
        f"Drafter profile {path}: {key!r} must be {expected}, found {found!r}. Fix the profile."
    )
