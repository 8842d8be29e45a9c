"""Drafter configuration (dflash-spec.md §1): parsing, the default target-layer rule, checks.

A drafter config is a Qwen3 config plus `block_size`, `num_target_layers` and
`dflash_config.{target_layer_ids, mask_token_id}`. The reference code (z-lab's
`dflash/model.py`) reads it as a transformers `Qwen3Config`, so this module does too: RoPE
parameters (every rope type transformers implements, `partial_rotary_factor`) and the
sliding-window rules (`use_sliding_window`, `layer_types`, `max_window_layers`) mean what
transformers makes of them. What z-lab's current code (commit 07ebd93db9f4) adds is read as it
reads it: `is_causal` (each layer's mask rule: `LayerAttention`) and the embedding and logit
fields. DFlash-2 configs carry their extra parts in `dflash2` (dflash2_config.py). Anything
the harness cannot honour (biases, other activations) is refused here, loudly, rather than
silently evaluated with the wrong maths, and so is any key outside config_keys' lists that
the profile does not accept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dflash_eval.contract.config_keys import CONFIG_BOUNDS, accepted_unknown_keys
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.numbers import check_numbers, parse_number
from dflash_eval.contract.schema import LayerAttentionRecord
from dflash_eval.drafter.dflash2_config import ARCHITECTURE as DFLASH2_ARCHITECTURE
from dflash_eval.drafter.dflash2_config import DFlash2Parts, read_dflash2

# The embedding and logit fields of z-lab's current code, with the value that changes nothing.
OUTPUT_FIELDS = {
    "input_embedding_scale": 1.0,
    "output_multiplier": 1.0,
    "final_logit_softcapping": None,
}
# Config keys that state the RoPE settings (absent: transformers' Qwen3 default applies).
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor")
# Qwen3Config's defaults, which the reference code gets for keys a config leaves out.
QWEN3_DEFAULT_ROPE_THETA = 10_000.0
QWEN3_DEFAULT_MAX_POSITIONS = 32768


@dataclass(frozen=True)
class LayerAttention:
    """One drafter layer's mask rule (dflash-spec.md §2.4). With query position i and key position
    j (absolute): a causal layer sees j ≤ i; a window w also needs i − j < w and, when the
    layer is not causal, j − i < w. A non-causal layer without a window sees all it is given.
    (No window on a sliding layer: the config turns windows off, as Qwen3Config reads it.)"""

    kind: str  # "full_attention" | "sliding_attention"
    causal: bool
    window: int | None

    @property
    def masked(self) -> bool:
        return self.causal or self.window is not None


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_layer_ids: tuple[int, ...]
    block_size: int
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = QWEN3_DEFAULT_ROPE_THETA
    rope_type: str = "default"
    # The rope type's own parameters (yarn: factor, original_max_position_embeddings…), as
    # transformers standardises them; empty for plain RoPE.
    rope_scaling: Mapping[str, Any] = field(default_factory=dict, hash=False)
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int = QWEN3_DEFAULT_MAX_POSITIONS
    # Per drafter layer: "full_attention" or "sliding_attention" (None: all full).
    layer_types: tuple[str, ...] | None = None
    # The window in effect (None when the config turns sliding windows off).
    sliding_window: int | None = None
    num_target_layers: int | None = None
    vocab_size: int | None = None
    dflash2: DFlash2Parts | None = None  # None: a plain DFlash drafter
    # The config's top-level `is_causal` (every layer); None: the reference's default, a
    # sliding_attention layer causal and a full_attention layer not.
    is_causal: bool | None = None
    # z-lab's current code (07ebd93) reads these at the top level or under dflash_config:
    # the block's input embeddings are multiplied by input_embedding_scale; the logits by
    # output_multiplier, then softcapped (tanh(logits / c) · c) when c > 0.
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    # Config keys outside config_keys' lists that the profile's accept_keys let through.
    accepted_keys: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def layer_attention(self, layer_index: int) -> LayerAttention:
        """What one drafter layer's queries see, as z-lab's current code (07ebd93) decides."""
        kind = "full_attention" if self.layer_types is None else self.layer_types[layer_index]
        sliding = kind == "sliding_attention"
        causal = is_causal_layer(kind, self.is_causal)
        return LayerAttention(kind, causal, self.sliding_window if sliding else None)

    def attention_record(self) -> list[LayerAttentionRecord]:
        """Each layer's attention semantics, for the results."""
        return [
            LayerAttentionRecord(**asdict(self.layer_attention(i)))
            for i in range(self.num_hidden_layers)
        ]

    def rope_parameters(self) -> dict[str, Any]:
        """transformers' `rope_parameters` for this config (also the provenance value)."""
        parameters: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        parameters.update(self.rope_scaling)
        if self.partial_rotary_factor != 1.0:
            parameters["partial_rotary_factor"] = self.partial_rotary_factor
        return parameters

    def to_hf_dict(self) -> dict[str, Any]:
        """The config as a Hugging Face DFlash config.json (what z-lab publishes)."""
        config: dict[str, Any] = {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "attention_bias": False,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            # rope_scaling is the key transformers 4.x reads; 5.x converts it.
            "rope_scaling": {"rope_type": self.rope_type, **self.rope_scaling}
            if self.rope_type != "default"
            else None,
            "max_position_embeddings": self.max_position_embeddings,
            "layer_types": list(self.layer_types or ["full_attention"] * self.num_hidden_layers),
            "use_sliding_window": self.sliding_window is not None,
            "sliding_window": self.sliding_window,
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "vocab_size": self.vocab_size,
            "dflash_config": {
                "target_layer_ids": list(self.target_layer_ids),
                "mask_token_id": self.mask_token_id,
            },
        }
        if self.dflash2 is not None:
            config["architectures"] = [DFLASH2_ARCHITECTURE]
            config["dflash_config"].update(self.dflash2.to_hf_dict())
        if self.partial_rotary_factor != 1.0:
            config["partial_rotary_factor"] = self.partial_rotary_factor
        if self.is_causal is not None:
            config["is_causal"] = self.is_causal
        for name, unset in OUTPUT_FIELDS.items():
            if getattr(self, name) != unset:
                config["dflash_config"][name] = getattr(self, name)
        return config


def is_causal_layer(kind: str, is_causal: bool | None) -> bool:
    """z-lab's current rule (07ebd93): the config's `is_causal` for every layer when given,
    else a sliding_attention layer is causal and a full_attention layer is not."""
    return kind == "sliding_attention" if is_causal is None else is_causal


def default_target_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """The reference rule: one layer → the middle; else spread over 1..L-3."""
    if count == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (count - 1)) for i in range(count)]


_REQUIRED = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)
# What the reference's Qwen3Config reads for RoPE and attention windows.
_QWEN3_KEYS = (
    "hidden_size",
    "num_attention_heads",
    "head_dim",
    "num_hidden_layers",
    "max_position_embeddings",
    *ROPE_KEYS,
    "use_sliding_window",
    "sliding_window",
    "max_window_layers",
    "layer_types",
)


def unnest(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """Training scripts sometimes nest the model config one level down."""
    for key in ("draft_config", "model_config", "drafter_config"):
        if isinstance(raw.get(key), Mapping) and "hidden_size" in raw[key]:
            return {**raw[key], **{k: v for k, v in raw.items() if k == "dflash_config"}}
    return raw


ATTENTION_KINDS = ("full_attention", "sliding_attention")  # what a drafter layer may be


def _check_layer_types(raw: Mapping[str, Any], where: str) -> None:
    """`layer_types` read by our rule before transformers sees it (whose own check is a
    traceback): one entry per layer, each a kind the drafter implements."""
    kinds = raw.get("layer_types")
    if kinds is None:
        return
    layers = int(raw["num_hidden_layers"])
    if not isinstance(kinds, list) or len(kinds) != layers:
        found = f"{len(kinds)} entries" if isinstance(kinds, list) else repr(kinds)
        raise HarnessError(
            f"The drafter config from {where}: layer_types must list one entry per layer "
            f"(num_hidden_layers {layers}), found {found}."
        )
    unknown = sorted({repr(kind) for kind in kinds if kind not in ATTENTION_KINDS})
    if unknown:
        raise HarnessError(
            f"The drafter config from {where}: layer_types holds {', '.join(unknown)}; a "
            f"drafter layer is one of {', '.join(ATTENTION_KINDS)}."
        )


def from_hf_dict(
    raw: Mapping[str, Any], where: str, accept_keys: Iterable[str] | None = ()
) -> DrafterConfig:
    """Parse a DFlash config dict (config.json, or the `config` of a training checkpoint).

    `where` names the source in error messages; a key outside config_keys' lists stops the
    run unless `accept_keys` names it (None: keys are not checked, for extract, which only
    copies the config). `block_size`, `mask_token_id` and
    `target_layer_ids` may sit at the top level or under `dflash_config`; missing ones are
    left unset (0, -1, ()) for the provenance rules to fill or refuse.
    """
    raw = unnest(raw)
    dflash = dict(raw.get("dflash_config") or {})
    missing = [name for name in _REQUIRED if name not in raw]
    if missing:
        raise HarnessError(
            f"The drafter config from {where} lacks {', '.join(missing)}. Expected a Qwen3-style "
            "DFlash config (hidden_size, intermediate_size, num_hidden_layers, heads...). "
            "Pass a complete one with --drafter-config FILE."
        )
    _refuse_unsupported(raw, dflash, where)
    check_numbers(raw, CONFIG_BOUNDS, f"the drafter config from {where}")
    check_numbers(dflash, CONFIG_BOUNDS, f"the drafter config from {where}: dflash_config")
    _refuse_two_block_sizes(raw, dflash, where)
    _check_layer_types(raw, where)
    accepted = {} if accept_keys is None else accepted_unknown_keys(raw, accept_keys, where)
    qwen3 = qwen3_config({k: raw[k] for k in _QWEN3_KEYS if k in raw}, where)
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    layer_types = tuple(qwen3.layer_types)
    stated = stated_settings(raw)
    return DrafterConfig(
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_hidden_layers=int(raw["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(raw["num_key_value_heads"]),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        target_layer_ids=stated.get("target_layer_ids", ()),
        block_size=stated.get("block_size", 0),
        mask_token_id=stated.get("mask_token_id", -1),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(qwen3.max_position_embeddings),
        **_rope_fields(qwen3.rope_parameters),
        layer_types=layer_types if "sliding_attention" in layer_types else None,
        sliding_window=int(qwen3.sliding_window) if qwen3.sliding_window else None,
        num_target_layers=stated.get("num_target_layers"),
        vocab_size=int(raw["vocab_size"]) if raw.get("vocab_size") else None,
        dflash2=read_dflash2(raw, dflash, hidden, where),
        is_causal=_is_causal(raw, where),
        **_output_fields(raw, dflash, where),
        accepted_keys=accepted,
    )


def _refuse_two_block_sizes(raw: Mapping[str, Any], dflash: Mapping[str, Any], where: str) -> None:
    """z-lab's code up to 7d2ea1e read the top-level block_size, 07ebd93 reads dflash_config's
    first: when they differ, the drafter's block size is not known."""
    top, nested = raw.get("block_size"), dflash.get("block_size")
    if top is not None and nested is not None and top != nested:
        raise HarnessError(
            f"The drafter config from {where} has block_size {top} at the top level and "
            f"{nested} under dflash_config; z-lab's older code reads the first, its current code "
            "the second, so the block size the drafter was trained with is unclear. Keep the "
            "right one in the config (or fix the config given with --drafter-config)."
        )


def _output_fields(
    raw: Mapping[str, Any], dflash: Mapping[str, Any], where: str
) -> dict[str, float | None]:
    """The three fields where the reference reads them: dflash_config first, then the top."""
    fields: dict[str, float | None] = {}
    for name, unset in OUTPUT_FIELDS.items():
        value = dflash.get(name, raw.get(name))
        if value is None:
            fields[name] = unset
        else:
            try:
                fields[name] = float(parse_number(name, value, text=False))
            except HarnessError:
                raise HarnessError(
                    f"The drafter config from {where} has {name}={value!r}; expected a "
                    "number (finite). Fix the config."
                ) from None
    return fields


def _is_causal(raw: Mapping[str, Any], where: str) -> bool | None:
    """The reference reads `is_causal` from the top level only (`bool(value)` of anything
    not None); a value that is not a JSON boolean would mean something surprising there."""
    value = raw.get("is_causal")
    if value is not None and not isinstance(value, bool):
        raise HarnessError(
            f"The drafter config from {where} has is_causal={value!r}; expected true, false or "
            "null (null: sliding_attention layers causal, full_attention layers not). Fix the "
            "config."
        )
    return value


def qwen3_config(values: Mapping[str, Any], where: str) -> Any:
    """A transformers Qwen3Config from config values: the class the reference reads a
    drafter config with, so RoPE standardisation and window rules are transformers' own."""
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    try:
        config = Qwen3Config(**values)
    except (KeyError, ValueError, TypeError) as error:
        raise HarnessError(
            f"The drafter config from {where} has RoPE or attention settings transformers "
            f"rejects: {error}. Fix the config (or pass the drafter's own with "
            "--drafter-config)."
        ) from None
    parameters = config.rope_parameters
    nested = [k for k, v in parameters.items() if isinstance(v, Mapping)]
    rope_type = parameters.get("rope_type")
    if nested or (rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS):
        supported = ", ".join(["default", *sorted(ROPE_INIT_FUNCTIONS)])
        raise HarnessError(
            f"The drafter config from {where} asks for RoPE {dict(parameters)!r}, which "
            f"transformers does not implement for Qwen3 (rope types: {supported}; one set of "
            "parameters for all layers). Evaluating it with another RoPE would give wrong "
            "numbers, so the run stops."
        )
    return config


def with_rope(config: DrafterConfig, parameters: Mapping[str, Any], where: str) -> DrafterConfig:
    """The config with its RoPE set from transformers-style `rope_parameters` (standardised
    and validated by transformers, as when the reference reads a config)."""
    values = rope_config_values(config, parameters)
    return replace(config, **_rope_fields(qwen3_config(values, where).rope_parameters))


def rope_config_values(config: DrafterConfig, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """What transformers' Qwen3Config needs to build this drafter's rotary embedding."""
    return {
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "head_dim": config.head_dim,
        "num_hidden_layers": config.num_hidden_layers,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_parameters": dict(parameters),
    }


def _rope_fields(standardised: Mapping[str, Any]) -> dict[str, Any]:
    """DrafterConfig's RoPE fields from transformers' standardised rope_parameters."""
    rope = {k: v for k, v in standardised.items() if k != "type"}  # "type": legacy alias
    return {
        "rope_theta": float(rope.pop("rope_theta")),
        "rope_type": str(rope.pop("rope_type")),
        "partial_rotary_factor": float(rope.pop("partial_rotary_factor", 1.0)),
        "rope_scaling": rope,
    }


def stated_settings(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The provenance-tracked settings a config dict states itself (absent keys: absent).

    `rope` is not among them: whether a config states it is `states_rope(raw)`, and its
    value is the parsed config's `rope_parameters()`.
    """
    raw = unnest(raw)
    dflash = raw.get("dflash_config") or {}
    stated: dict[str, Any] = {}
    block_size = raw.get("block_size", dflash.get("block_size"))
    layer_ids = dflash.get("target_layer_ids", raw.get("target_layer_ids"))
    mask_id = dflash.get("mask_token_id", raw.get("mask_token_id"))
    if block_size is not None:
        stated["block_size"] = _bounded("block_size", block_size)
    if layer_ids is not None:
        if not isinstance(layer_ids, list | tuple):
            raise HarnessError(
                f"target_layer_ids: expected a list of layer ids, found {layer_ids!r}"
            )
        stated["target_layer_ids"] = tuple(_bounded("target_layer_ids", i, 0) for i in layer_ids)
    if mask_id is not None:
        stated["mask_token_id"] = _bounded("mask_token_id", mask_id)
    if raw.get("num_target_layers"):
        stated["num_target_layers"] = _bounded("num_target_layers", raw["num_target_layers"])
    return stated


def _bounded(key: str, value: Any, minimum: float | None = None) -> int:
    """A whole config number within CONFIG_BOUNDS (layer ids: those of num_target_layers)."""
    low, high, _ = CONFIG_BOUNDS.get(key, CONFIG_BOUNDS["num_target_layers"])
    low = low if minimum is None else minimum
    return parse_number(key, value, minimum=low, maximum=high, whole=True, text=False)


def states_rope(raw: Mapping[str, Any]) -> bool:
    return any(unnest(raw).get(key) is not None for key in ROPE_KEYS)


def _refuse_unsupported(raw: Mapping[str, Any], dflash: Mapping[str, Any], where: str) -> None:
    problems = []
    if raw.get("attention_bias"):
        problems.append("attention_bias=true")
    if raw.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={raw.get('hidden_act')!r}")
    if problems:
        raise HarnessError(
            f"The drafter config from {where} uses features this harness does not implement: "
            f"{', '.join(problems)}. Evaluating it with plain DFlash maths would give wrong "
            "numbers, so the run stops. Use a plain DFlash (Qwen3-style) drafter, or extend "
            "remote/dflash_eval/drafter/model.py first."
        )
