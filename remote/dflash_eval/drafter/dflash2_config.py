"""The DFlash-2 part of a drafter config (z-lab's `DFlash2DraftModel`, docs/dflash2.md).

A DFlash-2 config is a DFlash config plus four integers, read as the reference reads them
(`dflash_config` first, then the top level): `conv_kernel_size` and `conv_group_size` (the
grouped dynamic causal convolutions around each layer's attention and MLP),
`selector_rank` and `selector_top_k` (the candidate selector). Its `vocab_size` sizes the
selector's codebooks, so it is required.

A config is DFlash-2 when its `architectures` names `DFlash2DraftModel` or it states any of
the four keys; a config that does one without the other, or lacks a key, stops the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dflash_eval.contract.errors import HarnessError

ARCHITECTURE = "DFlash2DraftModel"
KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


@dataclass(frozen=True)
class DFlash2Parts:
    conv_kernel_size: int  # taps of each causal convolution (offsets 0..K-1 back)
    conv_group_size: int  # channels sharing one dynamic kernel weight
    selector_rank: int  # width of the predecessor/successor codes
    selector_top_k: int  # candidates per slot

    def to_hf_dict(self) -> dict[str, int]:
        return {key: getattr(self, key) for key in KEYS}


def read_dflash2(
    raw: Mapping[str, Any], dflash: Mapping[str, Any], hidden_size: int, where: str
) -> DFlash2Parts | None:
    """The DFlash-2 parts a config states (None for a plain DFlash config)."""
    stated = {key: dflash.get(key, raw.get(key)) for key in KEYS}
    named = ARCHITECTURE in (raw.get("architectures") or [])
    if not named and all(value is None for value in stated.values()):
        return None
    advice = (
        "A DFlash-2 config (z-lab's DFlash2DraftModel) states architectures "
        f"[{ARCHITECTURE!r}] and {', '.join(KEYS)} (under dflash_config or at the top level). "
        "Pass the drafter's own config.json with --drafter-config."
    )
    if not named and raw.get("architectures"):
        raise HarnessError(
            f"The drafter config from {where} states DFlash-2 keys but its architectures are "
            f"{raw['architectures']}. {advice}"
        )
    missing = [key for key, value in stated.items() if value is None]
    if missing:
        raise HarnessError(
            f"The drafter config from {where} is a DFlash-2 config without "
            f"{', '.join(missing)}. {advice}"
        )
    bad = [f"{key}={value!r}" for key, value in stated.items() if not _positive_int(value)]
    if not _positive_int(raw.get("vocab_size")):
        bad.append(f"vocab_size={raw.get('vocab_size')!r} (sizes the selector's codebooks)")
    if not bad and hidden_size % int(stated["conv_group_size"]):
        bad.append(
            f"conv_group_size={stated['conv_group_size']} does not divide hidden_size {hidden_size}"
        )
    if bad:
        raise HarnessError(
            f"The drafter config from {where} has DFlash-2 values the reference cannot build "
            f"a drafter from: {', '.join(bad)} (each must be a positive integer). {advice}"
        )
    return DFlash2Parts(**{key: int(value) for key, value in stated.items()})


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
