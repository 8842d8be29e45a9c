"""Loading a drafter (dflash-spec.md §5): its checkpoint read (checkpoint.py), the config and
settings resolved (settings.py), checked against the target, then loaded strictly.

Strict means: every expected parameter present with its shape and nothing unexpected; any
mismatch stops the run with the names listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dflash_eval.drafter.checkpoint import DrafterSource, read_drafter
from dflash_eval.drafter.config import DrafterConfig
from dflash_eval.drafter.health import require_finite_weights
from dflash_eval.drafter.model import DFlashDrafter, build_drafter
from dflash_eval.drafter.model_dflash2 import drafter_class
from dflash_eval.drafter.pickle_policy import PicklePolicy
from dflash_eval.drafter.profile import DrafterProfile
from dflash_eval.drafter.provenance import Offer, Resolved
from dflash_eval.drafter.settings import check_fits, choose_settings
from dflash_eval.drafter.torch_reader import TORCH_READER
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
    source = read_drafter(path, TORCH_READER, policy, profile.names if profile else None)
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
