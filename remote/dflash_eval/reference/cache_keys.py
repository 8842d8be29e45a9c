"""The cache keys of completions, hidden states and the features record, in one place.

`eval` looks entries up with these keys and `plan` counts the hits with the very same ones,
without loading the target: every input below is known from the target's config, tokenizer
and safetensors headers, the drafter's settings and the prompts.
"""

from __future__ import annotations

from typing import Any

from dflash_eval.contract.urls import redact_url
from dflash_eval.reference.cache import tokens_digest

LOCAL_GREEDY = "local-greedy"
LOCAL_SAMPLED = "local-sampled"  # T > 0: the completion is sampled with the target itself


def shared_key(
    fingerprint: str,
    target_dtype: str,
    libraries: dict[str, str | None],
    device: str,
    kernel: dict[str, str],
) -> dict[str, Any]:
    """What every completion and hidden-state entry depends on (`target_dtype` as torch
    names it, e.g. "torch.float32")."""
    return {
        "target": fingerprint,
        "target_dtype": target_dtype,
        "libraries": libraries,
        "device": device,
        "kernel": kernel,
    }


def completion_source(
    sglang_url: str | None, served_model: str | None = None, served_version: str | None = None
) -> str:
    """Where completions come from, as keyed: never a URL's credentials. A server is keyed
    with the model and version it said it serves, so a URL that now serves another model (or
    another SGLang) never finds the completions of the old one."""
    if not sglang_url:
        return LOCAL_GREEDY
    source = f"sglang {redact_url(sglang_url.rstrip('/'))}"
    if served_model:
        source += f" serving {served_model} (SGLang {served_version or 'version not given'})"
    return source


def completion_key(
    shared: dict[str, Any],
    source: str,
    prompt_ids: list[int],
    max_new_tokens: int,
    stops: list[int],
    extra: int,
    sampling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """sampling: a sampled completion's settings and seed (absent at T = 0, so greedy
    entries keep their keys)."""
    key = {
        **shared,
        "kind": "completion",
        "source": source,
        "prompt_tokens": tokens_digest(prompt_ids),
        "max_new_tokens": max_new_tokens,
        "stop_token_ids": stops,
        # Tokens past the completion's end (max_new_tokens or the stop token): entries cut
        # at the end, from before this rule, lack this field and so never match.
        "extra_tokens": extra,
    }
    return key if sampling is None else {**key, "sampling": sampling}


def hidden_key(shared: dict[str, Any], tokens: list[int], layer_ids: list[int]) -> dict[str, Any]:
    return {
        **shared,
        "kind": "hidden_states",
        "tokens": tokens_digest(tokens),
        "num_tokens": len(tokens),
        "layer_ids": layer_ids,
    }


def features_key(
    shared: dict[str, Any], first_tokens: list[int], layer_ids: list[int]
) -> dict[str, Any]:
    """The features record (provenance and fidelity) sits beside the first prompt's states."""
    return {
        **shared,
        "kind": "features",
        "tokens": tokens_digest(first_tokens),
        "layer_ids": layer_ids,
    }
