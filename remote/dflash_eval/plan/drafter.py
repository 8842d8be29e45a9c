"""What the plan needs of a drafter (block size, target layers, size, dtype) without
building it: from the staged checkpoint when it is there, else from the command line and
the profile, else unknown until staged."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.weights import BORROWED
from dflash_eval.drafter.checkpoint import read_drafter
from dflash_eval.drafter.pickle_policy import PicklePolicy
from dflash_eval.drafter.profile import DrafterProfile, read_profile
from dflash_eval.drafter.settings import check_fits, choose_settings
from dflash_eval.drafter.shape_reader import SHAPES_READER
from dflash_eval.run.options import EvalOptions
from dflash_eval.target.config import TargetShape

UNKNOWN_UNTIL_STAGED = "unknown until staged"
UNREADABLE = "unknown: the run would stop loading the drafter"


@dataclass
class DrafterFacts:
    """What the cache keys and the estimate need of a drafter."""

    source: str  # "checkpoint" | "profile" | "command line" | UNKNOWN_UNTIL_STAGED | UNREADABLE
    block_size: int | None = None
    layer_ids: list[int] | None = None
    parameters: int | None = None
    dtype: str = "float32"
    hidden_size: int | None = None
    mask_token_id: int | None = None
    # The attention rule's inputs (diagnose's repairs of it): layer count, kinds, is_causal.
    num_hidden_layers: int | None = None
    layer_types: list[str] | None = None
    is_causal: bool | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def known(self) -> bool:
        return self.block_size is not None and self.layer_ids is not None

    def record(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "block_size": self.block_size,
            "target_layer_ids": self.layer_ids,
            "parameters": self.parameters,
            "dtype": self.dtype,
            "mask_token_id": self.mask_token_id,
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": self.layer_types,
            "is_causal": self.is_causal,
        }


def drafter_facts(options: EvalOptions, shape: TargetShape) -> DrafterFacts:
    """Block size and target layers from the staged checkpoint, else from the command line
    and the profile, else unknown."""
    profile = read_profile(options.drafter_profile) if options.drafter_profile else None
    if Path(options.checkpoint).exists():
        command_line = {
            "block_size": options.block_size,
            "mask_token_id": options.mask_token_id,
            "target_layer_ids": tuple(options.target_layer_ids)
            if options.target_layer_ids is not None
            else None,
            "dtype": options.dtype,
        }
        return _from_checkpoint(
            options.checkpoint, options, shape, profile, command_line, options.drafter_config
        )
    return _from_profile(options, profile)


def reference_facts(options: EvalOptions, shape: TargetShape) -> DrafterFacts:
    """The reference drafter is read with no flags of its own, as `eval` reads it."""
    assert options.reference_drafter is not None
    empty = {"block_size": None, "mask_token_id": None, "target_layer_ids": None, "dtype": None}
    return _from_checkpoint(options.reference_drafter, options, shape, None, empty, None)


def _from_checkpoint(
    path: Path,
    options: EvalOptions,
    shape: TargetShape,
    profile: DrafterProfile | None,
    command_line: dict[str, Any],
    config_file: Path | None,
) -> DrafterFacts:
    extra_globals = profile.safe_globals if profile else ()
    policy = PicklePolicy(tuple(options.safe_globals) + extra_globals, options.allow_unsafe_pickle)
    try:
        # Pickles are memory-mapped: reading a checkpoint's settings costs little of its size.
        source = read_drafter(path, SHAPES_READER, policy, profile.names if profile else None)
        chosen = choose_settings(
            source, shape, config_file, profile, command_line, tuple(options.accept_default)
        )
        check_fits(source, chosen, shape)  # the run's own checks, before it builds anything
    except HarnessError as error:
        return DrafterFacts(UNREADABLE, problems=[f"the drafter {path}: {error}"])
    config = chosen.config
    parameters = sum(t.numel() for name, t in source.state_dict.items() if name not in BORROWED)
    return DrafterFacts(
        "checkpoint",
        config.block_size,
        list(config.target_layer_ids),
        parameters,
        chosen.settings["dtype"].value,
        config.hidden_size,
        config.mask_token_id,
        config.num_hidden_layers,
        list(config.layer_types) if config.layer_types is not None else None,
        config.is_causal,
    )


def _from_profile(options: EvalOptions, profile: DrafterProfile | None) -> DrafterFacts:
    settings = dict(profile.settings) if profile else {}
    stated = dict(profile.config or {}) if profile else {}
    block = options.block_size or settings.get("block_size") or stated.get("block_size")
    layers = options.target_layer_ids or settings.get("target_layer_ids")
    layers = layers or (stated.get("dflash_config") or {}).get("target_layer_ids")
    if options.block_size and options.target_layer_ids:
        source = "command line"
    elif block and layers:
        source = "profile"
    else:
        return DrafterFacts(UNKNOWN_UNTIL_STAGED, dtype=options.dtype or "float32")
    return DrafterFacts(
        source,
        int(block),
        [int(i) for i in layers],
        dtype=options.dtype or settings.get("dtype") or "float32",
        mask_token_id=next(
            (
                token
                for token in (
                    options.mask_token_id,
                    settings.get("mask_token_id"),
                    (stated.get("dflash_config") or {}).get("mask_token_id"),
                )
                if token is not None  # 0 is a token
            ),
            None,
        ),
        num_hidden_layers=stated.get("num_hidden_layers"),
        layer_types=stated.get("layer_types"),
        is_causal=stated.get("is_causal"),
    )
