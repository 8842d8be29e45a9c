"""results["features"]: where the hidden states were computed, with what, and how close
they are to float32 (target/features.py says why that matters).

The record is made when the first prompt's hidden states are computed and is cached beside
them under the same key, so a run that finds everything cached reports the provenance and
fidelity of the features it used (measured where they were computed), without the target.
"""

from __future__ import annotations

from typing import Any

import torch

from dflash_eval.contract.progress import Progress
from dflash_eval.reference.cache_keys import features_key
from dflash_eval.reference.pipeline import Lookup
from dflash_eval.reference.sequence import Sequence
from dflash_eval.target.features import fidelity_needed, judge, provenance
from dflash_eval.target.fidelity import measure_fidelity
from dflash_eval.target.kernels import require_as_expected
from dflash_eval.target.source import TargetSource


def features_record(
    source: TargetSource,
    first: Sequence,
    lookup: Lookup,
    progress: Progress,
    warnings: list[str],
    host_name: str | None = None,
) -> dict[str, Any]:
    """The record of the features `lookup` serves, stored beside the first sequence's: from
    the cache, else measured now (as `host_name`, when given: the inventory's name for this
    host)."""
    first_tokens, first_hidden, layer_ids = first.tokens, first.hidden, lookup.layer_ids
    cache = lookup.cache
    key = features_key(lookup.shared_key, first_tokens, layer_ids)
    record = cache.get_record("features", key)
    if record is None:
        choice = source.dtype_choice
        ran = source.kernels_run(first_tokens, layer_ids)
        require_as_expected(source.kernel, ran)
        record = {
            **provenance(source.device, choice.name, choice.source, ran),
            "fidelity": _fidelity(source, first_tokens, first_hidden, layer_ids),
        }
        placement = source.placement_record()
        if placement is not None:
            record["placement"] = placement
        if host_name:
            record["host"] = host_name
        cache.put_record("features", key, record)
    report_fidelity(record, progress, warnings)
    return record


def report_fidelity(record: dict[str, Any], progress: Progress, warnings: list[str]) -> None:
    """Warn, loudly, about every layer past the bounds and about a skipped measurement."""
    fidelity = record["fidelity"]
    found = judge(fidelity.get("layers") or {})
    if fidelity["status"] == "skipped":
        found.append(f"features fidelity not measured: {fidelity['reason']}")
    for line in found:
        warnings.append(f"features: {line}")
        progress.warn(warnings[-1])


def _fidelity(
    source: TargetSource,
    tokens: list[int],
    hidden: dict[int, torch.Tensor],
    layer_ids: list[int],
) -> dict[str, Any]:
    reason = fidelity_needed(source.config, layer_ids, source.dtype_choice.name)
    if reason is not None:
        return {"status": "not needed", "reason": reason}
    target = source.target()
    measured = measure_fidelity(
        target.model,
        hidden,
        lambda: target.hidden_features(tokens, layer_ids),
        source.available_bytes,
    )
    return {"prompt_tokens_compared": len(tokens), **measured}
