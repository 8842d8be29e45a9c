"""Choosing a drafter's config and settings from everything that describes it.

The architecture (sizes, heads, norms, windows) comes from the first config available: the
checkpoint's own, then --drafter-config, then the profile's `config`, else it is inferred
from the parameter shapes; configs that are all given must agree. Each provenance-tracked
setting (block_size, target_layer_ids, mask_token_id, num_target_layers, rope, dtype) is
then chosen by the rules in provenance.py from the offers of every source. `check_fits` then
holds the chosen config to the target and to the weights' names and shapes (fit.py), as the
run and its dry run both do before building anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.summary import format_setting
from dflash_eval.drafter.checkpoint import DrafterSource
from dflash_eval.drafter.config import (
    DrafterConfig,
    default_target_layer_ids,
    from_hf_dict,
    stated_settings,
    states_rope,
    with_rope,
)
from dflash_eval.drafter.fit import (
    check_against_target,
    check_fits_target,
    check_parameters,
    infer_from_shapes,
    reference_key_mapping,
)
from dflash_eval.drafter.profile import DrafterProfile
from dflash_eval.drafter.provenance import (
    CHECKPOINT_CONFIG,
    COMMAND_LINE,
    CONFIG_FILE,
    DESCRIBING,
    PROFILE,
    TRAINING_ARGS,
    Offer,
    Resolved,
    accepted_defaults,
    resolve,
)
from dflash_eval.target.config import TargetShape

FLAGS = {
    "block_size": "--block-size",
    "mask_token_id": "--mask-token-id",
    "target_layer_ids": "--target-layer-ids",
    "dtype": "--dtype",
}
# Settings without a default rule first (their errors are the commonest and plainest);
# num_target_layers before target_layer_ids, whose default rule depends on it.
RESOLUTION_ORDER = (
    "block_size",
    "mask_token_id",
    "num_target_layers",
    "target_layer_ids",
    "rope",
    "dtype",
)
# Fields two configs of the same drafter must share (the settings are compared separately).
ARCHITECTURE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "max_position_embeddings",
    "layer_types",
    "sliding_window",
    "dflash2",  # a DFlash-2 config against a plain one (or other DFlash-2 parts)
    "is_causal",
    "input_embedding_scale",
    "output_multiplier",
    "final_logit_softcapping",
)


@dataclass
class ChosenSettings:
    config: DrafterConfig
    config_source: str
    settings: dict[str, Resolved]
    trained_block_size: int | None  # what the describing sources say (None: nothing does)
    notes: list[str]
    warnings: list[str]


@dataclass
class _StatedConfig:
    source: str
    label: str
    raw: dict[str, Any]
    parsed: DrafterConfig

    @property
    def config_source(self) -> str:
        """The results' `config_source` ("checkpoint", "file PATH", "profile NAME")."""
        return (
            "checkpoint" if self.source == CHECKPOINT_CONFIG else self.label.replace("config ", "")
        )


def choose_settings(
    source: DrafterSource,
    target: TargetShape,
    config_file: Path | None,
    profile: DrafterProfile | None,
    command_line: dict[str, Any],
    accept_default: tuple[str, ...],
) -> ChosenSettings:
    where = str(source.path)
    stated = _stated_configs(source, config_file, profile)
    if stated:
        config, config_source = stated[0].parsed, stated[0].config_source
    else:
        shapes = {name: tuple(t.shape) for name, t in source.state_dict.items()}
        config = infer_from_shapes(shapes, target)
        config_source = "inferred from parameter shapes + target config"
    offers = _offers(stated, profile, config, source, command_line)
    defaults = _defaults(config, stated, source, target)
    accepted = accepted_defaults(accept_default, profile.accept_default if profile else ())
    settings: dict[str, Resolved] = {}
    warnings: list[str] = []
    for name in RESOLUTION_ORDER:
        if name == "target_layer_ids":
            layers = settings["num_target_layers"].value
            defaults[name] = _default_layer_ids(layers, config, source)
        settings[name], warned = resolve(
            name, offers[name], defaults.get(name), accepted.get(name), where
        )
        warnings += warned
    _check_block_size(settings["block_size"], where)
    config = _apply(config, settings, where)
    described_blocks = [o.value for o in offers["block_size"] if o.source in DESCRIBING]
    return ChosenSettings(
        config=config,
        config_source=config_source,
        settings=settings,
        trained_block_size=described_blocks[0] if described_blocks else None,
        notes=_notes(settings, config, stated),
        warnings=warnings,
    )


def _stated_configs(
    source: DrafterSource, config_file: Path | None, profile: DrafterProfile | None
) -> list[_StatedConfig]:
    """The configs given for this drafter, in precedence order; they must agree."""
    given: list[tuple[str, str, dict[str, Any] | None]] = [
        (CHECKPOINT_CONFIG, "checkpoint config", source.config_dict),
        (CONFIG_FILE, f"config file {config_file}", _read_json(config_file)),
    ]
    if profile is not None and profile.config is not None:
        given.append((PROFILE, f"{profile.label} config", dict(profile.config)))
    accept_keys = profile.accept_keys if profile is not None else ()
    stated = [
        _StatedConfig(kind, label, raw, from_hf_dict(raw, f"{label} ({source.path})", accept_keys))
        for kind, label, raw in given
        if raw is not None
    ]
    for other in stated[1:]:
        _refuse_conflict(stated[0], other)
    return stated


def _read_json(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise HarnessError(f"Cannot read drafter config {path}: {error}.") from None


def _refuse_conflict(first: _StatedConfig, other: _StatedConfig) -> None:
    ours, theirs = vars(first.parsed), vars(other.parsed)
    differing = [name for name in ARCHITECTURE_FIELDS if ours[name] != theirs[name]]
    if differing:
        details = ", ".join(
            f"{name}: {first.label} {ours[name]} vs {other.label} {theirs[name]}"
            for name in differing
        )
        raise HarnessError(
            f"The {first.label} and the {other.label} describe different drafters ({details}). "
            f"The {first.label} is authoritative; drop the other or fix it."
        )


def _offers(
    stated: list[_StatedConfig],
    profile: DrafterProfile | None,
    config: DrafterConfig,
    source: DrafterSource,
    command_line: dict[str, Any],
) -> dict[str, list[Offer]]:
    offers: dict[str, list[Offer]] = {name: [] for name in (*FLAGS, "num_target_layers", "rope")}
    for item in stated:
        for name, value in stated_settings(item.raw).items():
            offers[name].append(Offer(item.source, value, item.label))
        if states_rope(item.raw):
            offers["rope"].append(Offer(item.source, item.parsed.rope_parameters(), item.label))
    if profile is not None:
        for name, value in profile.settings.items():
            if name == "rope_parameters":
                rope = with_rope(config, value, profile.label).rope_parameters()
                offers["rope"].append(Offer(PROFILE, rope, profile.label))
            else:
                offers[name].append(Offer(PROFILE, value, profile.label))
    args_label = "training args" + (" (kept by extract)" if source.kind == "extracted" else "")
    for name, value in source.extra_hints.items():
        if name in offers:
            offers[name].append(Offer(TRAINING_ARGS, _typed(name, value), args_label))
    for name, value in command_line.items():
        if isinstance(value, Offer):
            offers[name].append(value)  # inherited from another drafter, with its source
        elif value is not None:
            offers[name].append(Offer(COMMAND_LINE, value, FLAGS[name]))
    return offers


def _typed(name: str, value: Any) -> Any:
    return tuple(int(i) for i in value) if name == "target_layer_ids" else int(value)


def _defaults(
    config: DrafterConfig, stated: list[_StatedConfig], source: DrafterSource, target: TargetShape
) -> dict[str, Offer]:
    if stated:
        # The reference reads a config without RoPE keys as Qwen3Config's defaults.
        rope = Offer(
            "default rule",
            config.rope_parameters(),
            "default rule (transformers' Qwen3Config default, as the reference reads a config "
            "without RoPE keys)",
        )
    else:
        rope = Offer(
            "default rule",
            {"rope_type": "default", "rope_theta": target.rope_theta},
            "default rule (plain RoPE with the target's rope_theta)",
        )
    return {
        "num_target_layers": Offer(
            "default rule", target.num_layers, "default rule (the target's layer count)"
        ),
        "rope": rope,
        "dtype": Offer("default rule", "float32", "default rule"),
    }


def _default_layer_ids(
    num_target_layers: int, config: DrafterConfig, source: DrafterSource
) -> Offer:
    """The reference rule, over K layers: K read from fc.weight (it takes K·hidden inputs),
    else one per drafter layer as the reference code assumes."""
    fc = source.state_dict.get("fc.weight")
    if fc is not None and fc.ndim == 2 and fc.shape[1] % config.hidden_size == 0:
        count, why = fc.shape[1] // config.hidden_size, "fc.weight's input size"
    else:
        count, why = config.num_hidden_layers, "one per drafter layer"
    ids = tuple(default_target_layer_ids(num_target_layers, count))
    label = f"default rule (L={num_target_layers}, K={count} from {why})"
    return Offer("default rule", ids, label)


def _check_block_size(block_size: Resolved, where: str) -> None:
    if not isinstance(block_size.value, int) or block_size.value < 2:
        raise HarnessError(
            f"block_size {block_size.value} ({block_size.label}, {where}) is not a usable block "
            "size (a block is the anchor plus at least one drafted slot). Pass --block-size N "
            "with the block size the drafter was trained with (usually 16)."
        )


def _apply(config: DrafterConfig, settings: dict[str, Resolved], where: str) -> DrafterConfig:
    config = replace(
        config,
        block_size=settings["block_size"].value,
        target_layer_ids=tuple(settings["target_layer_ids"].value),
        mask_token_id=settings["mask_token_id"].value,
        num_target_layers=settings["num_target_layers"].value,
    )
    return with_rope(config, settings["rope"].value, where)


def _notes(
    settings: dict[str, Resolved], config: DrafterConfig, stated: list[_StatedConfig]
) -> list[str]:
    """What people should know: settings not from the architecture's own config."""
    own = stated[0].source if stated else None
    notes = [
        f"{name} {format_setting(name, setting.value)} from the {setting.label}"
        + (f", accepted by {setting.accepted_by}" if setting.accepted_by else "")
        for name, setting in settings.items()
        if setting.source != own and name != "dtype"
    ]
    if config.layer_types and config.sliding_window is None:
        notes.append(
            "layer_types marks sliding_attention layers but the config has no window in effect "
            "(use_sliding_window is false or sliding_window is null): like the reference "
            "(transformers' Qwen3Config drops the window), those layers have no window (they "
            "stay causal unless is_causal says otherwise)"
        )
    return notes


def check_fits(source: DrafterSource, chosen: ChosenSettings, target: TargetShape) -> list[str]:
    """The chosen config against the target and against the weights' names and shapes, as
    the run checks before building anything (the dry run checks the same). Returns the
    borrowed names set aside; a DFlash-2 checkpoint's names are mapped to ours in `source`."""
    config, path = chosen.config, source.path
    check_against_target(config, target, f"{chosen.config_source} ({path})")
    if config.dflash2 is not None:
        check_fits_target(config, target, f"{chosen.config_source} ({path})")
        renamed, source.state_dict = reference_key_mapping(source.state_dict, path)
        source.renamed_parameters += renamed
    return check_parameters(source.state_dict, config, path)
