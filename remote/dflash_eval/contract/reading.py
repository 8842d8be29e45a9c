"""Reading a Results (schema.py) beyond its plain fields: what makes two runs comparable,
the confidence-interval groups, acceptance by position. Shared by the harness's summary and
the workstation's comparisons. Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from dflash_eval.contract.schema import FEATURES_IDENTITY, Results
from dflash_eval.contract.schema_metrics import Group, Interval, Metrics
from dflash_eval.contract.version import NUMERICS_OF_UNVERSIONED, compared_numerics

ALL_PROMPTS = "all prompts"  # the name of the group of every prompt (by_dataset.overall)

# What must match for two runs' numbers to be comparable, and how to read it from results.
COMPARABILITY: dict[str, Callable[[Results], Any]] = {
    "prompts": lambda r: r["prompts"]["sha256"],
    "target": lambda r: r["target"]["fingerprint"],
    "block size": lambda r: r["metrics"]["block_size"],
    "max new tokens": lambda r: r["prompts"]["max_new_tokens"],
    "completions": lambda r: r["completions"]["source"],
    "max blocks": lambda r: r["options"].get("max_blocks"),
    "target dtype": lambda r: r["target"]["dtype"],
    "drafter dtype": lambda r: (r["drafter"].get("settings") or {}).get("dtype"),
    "thinking": lambda r: r["options"].get("thinking"),
    "features": lambda r: features_identity(r),
    "τ convention": lambda r: r["metrics"]["tau_convention"],
    # None at T = 0 (greedy); the seed and the Monte Carlo samples do not change what is measured.
    "sampling": lambda r: sampling_settings(r["metrics"]),
    "attention rule": lambda r: attention_rule(r),
    "numerics": lambda r: numerics(r),
}

# Why a difference in a comparability key matters, where the name alone does not say it.
COMPARABILITY_WHY = {
    "attention rule": "results before schema 3 masked sliding-window layers both ways; z-lab's "
    "current code (07ebd93) makes them causal unless the config's is_causal says otherwise",
    "numerics": "the harness's metric definitions, drafter maths, completion or feature "
    "rules differ (harness.numerics_version); a run written before the version was recorded "
    "is keyed on its harness content hash unless that hash is a known version-1 harness",
}


def comparability_key(results: Results) -> dict[str, Any]:
    """Everything that must match for two results to be compared, by what it is called."""
    return {name: read(results) for name, read in COMPARABILITY.items()}


KEY_ID_PREFIX = "k"  # a letter first: CSV readers keep '0123e456' text, not a number
KEY_ID_DIGITS = 8  # hex digits: distinct for tens of thousands of keys


def canonical(key: dict[str, Any]) -> str:
    """A key as text that is equal exactly when the keys are (nested dicts included)."""
    return json.dumps(key, sort_keys=True, default=str)


def key_id(key: dict[str, Any]) -> str:
    """A comparability key's short, stable name ('k3f9a1b2c'): equal exactly when the keys
    are. Settings a results file does not have (None) are left out of the hash, so a setting
    added to COMPARABILITY later leaves the names of earlier results as they were."""
    present = {name: value for name, value in key.items() if value is not None}
    digest = hashlib.sha256(canonical(present).encode()).hexdigest()
    return KEY_ID_PREFIX + digest[:KEY_ID_DIGITS]


def comparability_id(results: Results) -> str:
    """The short name of a results file's comparability key, computed from its settings
    (so results pulled before the name existed have one too)."""
    return key_id(comparability_key(results))


def sampling_settings(metrics: Metrics) -> tuple[float, float, int] | None:
    """(temperature, top_p, top_k) of a T > 0 run; None at T = 0."""
    found = metrics.get("sampling")
    return None if found is None else (found["temperature"], found["top_p"], found["top_k"])


def attention_rule(results: Results) -> str | None:
    """The mask rule the drafter was evaluated under, where it matters: None for a drafter of
    plain full, non-causal layers (every schema masked those alike)."""
    drafter = results["drafter"]
    layers = drafter.get("attention")
    if layers is None:  # schema 2 recorded no rule: sliding layers were non-causal
        layer_types = drafter["config"].get("layer_types") or []
        return "sliding both ways (schema 2)" if "sliding_attention" in layer_types else None
    if all(layer["kind"] == "full_attention" and not layer["causal"] for layer in layers):
        return None
    return "zlab 07ebd93"


def numerics(results: Results) -> int | str:
    """The numerics version the results are compared under (a greedy run of a version that
    left greedy numbers as they were counts as the earlier one). Results written before it was
    recorded name only their code (`harness.content_sha256`): a hash checked to compute
    version 1's numbers counts as version 1; any other stays its own key, comparable only
    with results of the very same harness code (what compare keyed on before)."""
    harness = results["harness"]
    version = harness.get("numerics_version")
    if version is not None:
        return compared_numerics(version, sampled=results["metrics"].get("sampling") is not None)
    content = harness["content_sha256"]
    return NUMERICS_OF_UNVERSIONED.get(content, f"unversioned harness {content[:16]}")


def features_identity(results: Results) -> dict[str, Any] | None:
    """What computed the features (host, device, dtype, kernels, libraries); None for results
    written before the harness recorded it."""
    features = results.get("features")
    return {name: features.get(name) for name in FEATURES_IDENTITY} if features else None


def conditional_by_position(metrics: Metrics) -> dict[int, float | None]:
    return {row["position"]: row["conditional"] for row in metrics["per_position"]}


def ddtree_tau(metrics: Metrics, budget: str) -> float | None:
    """DDTree τ macro at `budget` (None when that run did not evaluate it)."""
    found = metrics["ddtree"].get(budget)
    return found["tau_macro"] if found else None


def groups(results: Results) -> dict[str, Group]:
    """Every prompt's group, then each named set's, with their intervals ({} for results
    written before intervals were)."""
    block = results.get("by_dataset")
    return {ALL_PROMPTS: block["overall"], **block["datasets"]} if block else {}


def overall_interval(results: Results, metric: str = "tau_macro") -> Interval | None:
    """Every prompt's `tau_macro` or `tau_pooled` with its interval (None: none recorded): at
    T > 0 the t interval over prompt means (`metrics.sampling.interval`, the one that covers
    the live loop's τ: docs/sampling.md), else the bootstrap's."""
    sampled = (results["metrics"].get("sampling") or {}).get("interval")
    if sampled:
        return sampled[metric]
    block = results.get("by_dataset")
    return block["overall"][metric] if block else None


def ddtree_interval(group: Group | None, budget: str) -> Interval | None:
    """A group's DDTree τ macro at `budget` with its interval."""
    found = group["ddtree"].get(budget) if group else None
    return found["tau_macro"] if found else None


def overlaps(first: Interval | None, second: Interval | None) -> bool | None:
    """Whether two intervals share a point (None when either is missing or unbounded)."""
    if not first or not second or first["low"] is None or second["low"] is None:
        return None  # a single unit has neither bound
    return first["low"] <= second["high"] and second["low"] <= first["high"]


def format_interval(interval: Interval | None, digits: int = 3) -> str:
    """'3.210 [2.980, 3.450]', '3.210 [one unit: no interval]', or 'n/a'."""
    if not interval:
        return "n/a"
    if interval["low"] is None:
        return f"{interval['value']:.{digits}f} [one unit: no interval]"
    return (
        f"{interval['value']:.{digits}f} "
        f"[{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]"
    )
