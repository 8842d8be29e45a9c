"""The target's side of a run, shared by `eval` and `features`: per prompt, the reference
completion, then the target's hidden states over prompt + reference.

Each value is looked up first under a key of everything that determines it (cache.py). What
a miss means is the caller's choice (`Lookup.missing`): compute it with the target (or
SGLang) and store it, or, when the entries come from a feature set computed elsewhere, stop
with an error: computing it here would mix features of two provenances in one run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.progress import Progress, Timer
from dflash_eval.contract.prompts import Prompt
from dflash_eval.drafter.fit import require_context
from dflash_eval.reference import cache_keys
from dflash_eval.reference.cache import DiskCache
from dflash_eval.reference.completions import (
    SGLangClient,
    greedy_reference,
    sampled_reference,
)
from dflash_eval.reference.conversation import Conversations
from dflash_eval.reference.sequence import Sequence
from dflash_eval.target.dtype import dtype_key
from dflash_eval.target.source import TargetSource
from dflash_eval.walk.sampling_settings import Sampling

LOCAL_GREEDY = cache_keys.LOCAL_GREEDY


# A miss that must not be computed: (the prompt, "completion" | "hidden states") → the error.
Missing = Callable[[Prompt, str], HarnessError]


@dataclass
class Lookup:
    """Where a run finds its completions and hidden states, and under which keys."""

    cache: DiskCache
    shared_key: dict[str, Any]  # what every entry depends on (target, dtype, device, kernel…)
    completion_source: str  # LOCAL_GREEDY or "sglang <url>": part of the completion key
    extra_tokens: int  # reference tokens past the completion's end: the largest block size
    layer_ids: list[int]  # the target layers whose hidden states are stored
    missing: Missing | None = None  # None: compute a miss and store it
    sampling: Sampling | None = None  # T > 0: references sampled locally (walk/sampling.py)
    served: dict[str, Any] | None = None  # the SGLang server's model and version


def shared_key(fingerprint: str, target: TargetSource, libraries: dict[str, Any]) -> dict:
    """What every cached completion and hidden-state entry depends on."""
    return cache_keys.shared_key(
        fingerprint, dtype_key(target.dtype_choice.name), libraries, target.device, target.kernel
    )


def completion_source(client: SGLangClient | None) -> str:
    if client is None:
        return cache_keys.LOCAL_GREEDY
    served = client.served
    return cache_keys.completion_source(
        client.url, served and served.model_path, served and served.version
    )


def target_side(
    sequences: list[Sequence],
    lookup: Lookup,
    target: TargetSource,
    client: SGLangClient | None,
    max_new_tokens: int,
    conversations: Conversations,
    progress: Progress,
    timer: Timer,
    keep_all: bool = True,
) -> None:
    """Both phases, each timed: the references, then the hidden states."""
    with timer.phase("completions"):
        make_references(sequences, lookup, target, client, max_new_tokens, conversations, progress)
    with timer.phase("hidden_states"):
        hidden_states(sequences, lookup, target, progress, keep_all)


def make_references(
    sequences: list[Sequence],
    lookup: Lookup,
    target: TargetSource,
    client: SGLangClient | None,
    max_new_tokens: int,
    conversations: Conversations,
    progress: Progress,
) -> None:
    """Phase `completions`: each sequence's reference and span (later turns of a
    conversation are encoded once the turn before has its completion)."""
    total, stops = len(sequences), target.stops

    def fits(seq: Sequence) -> None:
        require_context(
            seq.prompt.id, len(seq.prompt_ids), max_new_tokens, lookup.extra_tokens, target.context
        )

    for seq in sequences:  # every first turn before any work; later turns once encoded
        if not seq.prompt.follows:
            fits(seq)
    progress.progress("completions", 0, total)
    for done, seq in enumerate(sequences, start=1):
        if seq.prompt.follows:
            seq.prompt_ids = conversations.encode(seq.prompt, seq.path)
            fits(seq)
        key = cache_keys.completion_key(
            lookup.shared_key,
            lookup.completion_source,
            seq.prompt_ids,
            max_new_tokens,
            stops,
            lookup.extra_tokens,
            lookup.sampling.key(seq.path) if lookup.sampling else None,
        )
        args = (seq.prompt_ids, max_new_tokens, lookup.extra_tokens, stops)
        if lookup.sampling is not None:
            reference = _sampled(seq, key, lookup, target, args)
        else:
            reference = lookup.cache.get_completion(key)
            seq.completion_hit = reference is not None
        if reference is None:
            if lookup.missing is not None:
                raise lookup.missing(seq.prompt, "completion")
            if client is not None:
                reference = client.reference(*args)
            else:
                reference = greedy_reference(target.target().model, *args)
            lookup.cache.put_completion(key, reference)
        seq.take_reference(reference, max_new_tokens, stops)
        conversations.replied(seq.prompt, seq.completion, seq.path)
        progress.progress("completions", done, total)


def _sampled(
    seq: Sequence,
    key: dict[str, Any],
    lookup: Lookup,
    target: TargetSource,
    args: tuple[list[int], int, int, list[int]],
) -> list[int]:
    """A sampled reference and its tokens' probabilities (`seq.target_probs`), from the
    cache (both entries) or sampled with the target and stored."""
    assert lookup.sampling is not None, "only for sampled references"
    reference = lookup.cache.get_completion(key)
    probs = lookup.cache.get_record("path_probs", key)
    seq.completion_hit = reference is not None and probs is not None
    if reference is None or probs is None:
        reference, seq.target_probs = sampled_reference(
            target.target().model, *args, lookup.sampling, seq.path
        )
        lookup.cache.put_completion(key, reference)
        lookup.cache.put_record("path_probs", key, {"probs": seq.target_probs})
    else:
        seq.target_probs = probs["probs"]
    return reference


def hidden_states(
    sequences: list[Sequence],
    lookup: Lookup,
    target: TargetSource,
    progress: Progress,
    keep_all: bool = True,
) -> None:
    """Phase `hidden_states`: each sequence's target features at `lookup.layer_ids`. Without
    `keep_all` only the first sequence keeps them in memory (the fidelity check reads it);
    the others are only made sure to be stored."""
    total = len(sequences)
    progress.progress("hidden_states", 0, total)
    for done, seq in enumerate(sequences, start=1):
        key = cache_keys.hidden_key(lookup.shared_key, seq.tokens, lookup.layer_ids)
        hidden = lookup.cache.get_hidden(key)
        seq.hidden_hit = hidden is not None
        if hidden is None:
            if lookup.missing is not None:
                raise lookup.missing(seq.prompt, "hidden states")
            hidden = target.target().hidden_features(seq.tokens, lookup.layer_ids)
            lookup.cache.put_hidden(key, hidden)
        expected = (len(seq.tokens), target.shape.hidden_size)
        if any(tuple(h.shape) != expected for h in hidden.values()):
            raise HarnessError(
                f"Hidden states for prompt {seq.prompt.id} have shapes "
                f"{[tuple(h.shape) for h in hidden.values()]}, expected {expected}. "
                f"Delete the cache directory and re-run."
            )
        if keep_all or done == 1:
            seq.hidden = hidden
        progress.progress("hidden_states", done, total)
