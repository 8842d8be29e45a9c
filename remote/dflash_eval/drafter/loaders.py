"""Loading a drafter (dflash-spec.md §5): its checkpoint read (checkpoint.py), the config and
settings resolved (settings.py), checked against the target, then loaded strictly.

Strict means: every expected parameter present with its shape and nothing unexpected; any
mismatch stops the run with the names listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dflash_eval.contract.errors import HarnessError
from dflash_eval.drafter.checkpoint import BORROWED, DrafterSource, read_drafter
from dflash_eval.drafter.config import DrafterConfig
from dflash_eval.drafter.fit import check_against_target
from dflash_eval.drafter.health import require_finite_weights
from dflash_eval.drafter.model import DFlashDrafter, build_drafter, expected_shapes
from dflash_eval.drafter.model_dflash2 import (
    check_fits_target,
    drafter_class,
    reference_key_mapping,
)
from dflash_eval.drafter.pickle_policy import PicklePolicy
from dflash_eval.drafter.profile import DrafterProfile
from dflash_eval.drafter.provenance import Offer, Resolved
from dflash_eval.drafter.settings import ChosenSettings, choose_settings
from dflash_eval.target.config import TargetShape
from dflash_eval.target.model import DTYPES


@dataclass
class LoadedDrafter:
    source: DrafterSource
    config: DrafterConfig
    config_source: str  # "checkpoint config" | "config file PATH" | "profile …" | "inferred …"
    trained_block_size: int | None
    settings: dict[str, Resolved]  # block_size, target_layer_ids, … with their sources
    dtype: str  # "float32" | "bfloat16"
    notes: list[str]
    warnings: list[str]
    ignored_parameters: list[str]
    model: DFlashDrafter
    profile: DrafterProfile | None = None

    def provenance(self) -> dict[str, str]:
        return {name: setting.source for name, setting in self.settings.items()}

    def accepted_defaults(self) -> dict[str, str]:
        return {n: s.accepted_by for n, s in self.settings.items() if s.accepted_by is not None}

    def dtype_offer(self) -> Offer:
        """This drafter's dtype, for another drafter to be evaluated alike."""
        setting = self.settings["dtype"]
        return Offer(setting.source, setting.value, f"{setting.label} (as the drafter)")


def load_drafter(
    path: Path,
    target: TargetShape,
    *,
    config_file: Path | None = None,
    profile: DrafterProfile | None = None,
    block_size: int | None = None,
    mask_token_id: int | None = None,
    target_layer_ids: list[int] | None = None,
    dtype: str | Offer | None = None,
    accept_default: tuple[str, ...] | list[str] = (),
    pickle_policy: PicklePolicy | None = None,
) -> LoadedDrafter:
    """Read, choose the config and every setting (with provenance), check, load strictly.

    The keyword values are the harness's command-line flags (None: not given); `dtype` may
    also be another drafter's (an Offer keeping its source).
    """
    policy = pickle_policy or PicklePolicy()
    if profile is not None and profile.safe_globals:
        policy = PicklePolicy(policy.safe_globals + profile.safe_globals, policy.allow_unsafe)
    source = read_drafter(path, policy, profile.names if profile else None)
    command_line = {
        "block_size": block_size,
        "mask_token_id": mask_token_id,
        "target_layer_ids": tuple(target_layer_ids) if target_layer_ids is not None else None,
        "dtype": dtype,
    }
    chosen = choose_settings(
        source, target, config_file, profile, command_line, tuple(accept_default)
    )
    config = chosen.config
    ignored = check_fits(source, chosen, target)
    torch_dtype = DTYPES[chosen.settings["dtype"].value]
    model = build_drafter(config, torch_dtype, drafter_class(config))
    wanted = {k: v.to(torch_dtype) for k, v in source.state_dict.items() if k not in ignored}
    require_finite_weights(wanted, path, chosen.settings["dtype"].value)
    model.load_state_dict(wanted, strict=True)
    return LoadedDrafter(
        source=source,
        config=config,
        config_source=chosen.config_source,
        trained_block_size=chosen.trained_block_size,
        settings=chosen.settings,
        dtype=chosen.settings["dtype"].value,
        notes=chosen.notes,
        warnings=chosen.warnings,
        ignored_parameters=ignored,
        model=model,
        profile=profile,
    )


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


def check_parameters(
    state_dict: dict[str, torch.Tensor], config: DrafterConfig, path: Path
) -> list[str]:
    """Strict name/shape check. Returns the borrowed names set aside; raises on mismatch."""
    ignored = sorted(
        name for name in state_dict if name in BORROWED or name.endswith("rotary_emb.inv_freq")
    )
    found = {name: tuple(t.shape) for name, t in state_dict.items() if name not in ignored}
    expected = expected_shapes(config, drafter_class(config))
    fc_shape = found.get("fc.weight")
    fc_inputs = len(config.target_layer_ids) * config.hidden_size
    fc_hint = None
    if fc_shape is not None and len(fc_shape) == 2 and fc_shape[1] != fc_inputs:
        fc_hint = (
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
        if expected[name] != found[name] and not (name == "fc.weight" and fc_hint)
    ]
    if not (missing or unexpected or misshaped):
        if fc_hint:
            raise HarnessError(fc_hint)
        return ignored
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
    if config.dflash2 is None and any(_is_dflash2_part(name) for name in unexpected):
        parts.append(
            "the unexpected names are DFlash-2 parts (convolutions, candidate selector): "
            "this is a DFlash-2 checkpoint and needs its DFlash-2 config"
        )
    # Every mismatch at once: fixing one and rerunning to find the next wastes a target load.
    raise HarnessError(
        f"The parameters in {path} do not match the drafter config "
        f"({config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads}/{config.num_key_value_heads} heads × "
        f"{config.head_dim}): " + "; ".join(parts) + ". The checkpoint and the config "
        "describe different architectures; pass the drafter's own config "
        "(--drafter-config) or check that this is a DFlash drafter checkpoint."
        + (f" Also: {fc_hint}" if fc_hint else "")
    )


def _is_dflash2_part(name: str) -> bool:
    return name.startswith("candidate_selector.") or "_conv." in name
