"""Where each drafter setting came from, and the rules for choosing it.

A drafter evaluated with the wrong block size, target layers, mask token or RoPE still
produces a τ, just a wrong one, so every such setting records its source:

- "command line": an explicit harness flag. It wins; where it differs from what a source
  below says the drafter was trained with, the run warns (loudly, in `warnings`).
- "checkpoint config", "config file" (--drafter-config), "profile" (--drafter-profile),
  "training args" (the checkpoint's `args`): descriptions of the drafter. Every one that
  states a setting must agree, else the run stops naming them; the first in this order is
  recorded.
- "default rule": the harness's fallback. Taken without a word only where it cannot change
  the numbers (num_target_layers: the target's layer count, only checked against it; dtype:
  float32, an evaluation choice). For target_layer_ids and rope the rule is a guess about
  how the drafter was trained, so it is used only when the user confirms it
  (--accept-default, or the profile's "accept_default"); otherwise the run stops, naming
  the setting and how to give it. block_size and mask_token_id have no default rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.schema import DRAFTER_SETTINGS
from dflash_eval.contract.summary import format_setting

COMMAND_LINE = "command line"
CHECKPOINT_CONFIG = "checkpoint config"
CONFIG_FILE = "config file"
PROFILE = "profile"
TRAINING_ARGS = "training args"
DEFAULT_RULE = "default rule"
# Sources that describe how the drafter was trained, in the order they are recorded.
DESCRIBING = (CHECKPOINT_CONFIG, CONFIG_FILE, PROFILE, TRAINING_ARGS)

SETTINGS = DRAFTER_SETTINGS
# Settings whose default rule cannot change the numbers.
HARMLESS_DEFAULTS = ("num_target_layers", "dtype")
# Settings whose default rule is a guess the user may confirm.
CONFIRMABLE_DEFAULTS = ("target_layer_ids", "rope")
HOW_TO_GIVE = {
    "block_size": "--block-size N (the block size the drafter was trained with, usually 16)",
    "target_layer_ids": "--target-layer-ids 1,9,17 (the target layers it was trained on), "
    '"target_layer_ids" in the profile, or a complete --drafter-config',
    "mask_token_id": "--mask-token-id ID (the id the drafter was trained with), "
    '"mask_token_id" in the profile, or a complete --drafter-config',
    "num_target_layers": '"num_target_layers" in --drafter-config or the profile',
    "rope": '"rope_theta"/"rope_scaling" in --drafter-config, or "rope_parameters" in the profile',
    "dtype": "--dtype",
}


@dataclass(frozen=True)
class Offer:
    """One source's value for a setting."""

    source: str  # one of the source names above
    value: Any
    label: str  # how messages name it: "--block-size", "profile lab", "training args"…


@dataclass(frozen=True)
class Resolved:
    """The value used for a setting and where it came from."""

    value: Any
    source: str
    label: str
    accepted_by: str | None = None  # who confirmed a default rule ("command line"/"profile")


def resolve(
    name: str, offers: list[Offer], default: Offer | None, accepted_by: str | None, where: str
) -> tuple[Resolved, list[str]]:
    """Choose one setting's value by the rules above; returns it and any warnings."""
    given = [offer for offer in offers if offer.source == COMMAND_LINE]
    described = sorted(
        (offer for offer in offers if offer.source in DESCRIBING),
        key=lambda offer: DESCRIBING.index(offer.source),
    )
    if given:
        chosen = given[0]
        warnings = [
            _override_warning(name, chosen, offer)
            for offer in described
            if offer.value != chosen.value and name != "dtype"
        ]
        return Resolved(chosen.value, chosen.source, chosen.label), warnings
    if described:
        if any(offer.value != described[0].value for offer in described):
            stated = "; ".join(f"{o.label}: {format_setting(name, o.value)}" for o in described)
            raise HarnessError(
                f"The sources describing the drafter ({where}) disagree on {name} ({stated}). "
                "The harness will not guess which one it was trained with: fix the wrong one, "
                f"or choose explicitly with {HOW_TO_GIVE[name]}."
            )
        first = described[0]
        return Resolved(first.value, first.source, first.label), []
    if default is None:
        raise HarnessError(
            f"Nothing states the drafter's {name} ({where}: no checkpoint config, config file, "
            f"profile or training args give it). Pass {HOW_TO_GIVE[name]}."
        )
    if name not in HARMLESS_DEFAULTS and accepted_by is None:
        raise HarnessError(
            f"Nothing states the drafter's {name} ({where}: no checkpoint config, config file, "
            f"profile or training args give it). The {default.label} would give "
            f"{format_setting(name, default.value)}, but a drafter trained otherwise would then "
            f"be evaluated wrongly without a word. Give it with {HOW_TO_GIVE[name]}, or confirm "
            f'the rule with --accept-default {name} (or "accept_default" in the profile).'
        )
    return Resolved(default.value, DEFAULT_RULE, default.label, accepted_by), []


def _override_warning(name: str, chosen: Offer, described: Offer) -> str:
    ours, theirs = format_setting(name, chosen.value), format_setting(name, described.value)
    if name == "block_size":
        return (
            f"{chosen.label} {ours} differs from the block size the drafter was trained with "
            f"({theirs}) according to the {described.label}; τ will not be comparable with "
            "other runs"
        )
    return (
        f"{chosen.label} {ours} overrides the {described.label}'s {theirs}; the drafter was "
        "trained with the latter"
    )


def accepted_defaults(
    from_command_line: tuple[str, ...] | list[str], from_profile: tuple[str, ...] | list[str]
) -> dict[str, str]:
    """{setting: who confirmed its default rule}; unknown names are refused."""
    accepted: dict[str, str] = {}
    for who, names in ((PROFILE, from_profile), (COMMAND_LINE, from_command_line)):
        for name in names:
            if name not in CONFIRMABLE_DEFAULTS + HARMLESS_DEFAULTS:
                raise HarnessError(
                    f"--accept-default {name}: only settings with a default rule can be "
                    f"accepted ({', '.join(CONFIRMABLE_DEFAULTS + HARMLESS_DEFAULTS)}); "
                    f"{name} must be given ({HOW_TO_GIVE.get(name, 'see --help')})."
                )
            accepted[name] = who
    return accepted


def json_value(value: Any) -> Any:
    """A setting's value for the results JSON."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value
