"""A few decoded drafts per run, so that garbage output is visible at a glance.

For the first SAMPLE_PROMPTS prompts: the start of the target's completion as text, and for
the first SAMPLE_ROUNDS rounds of the (vanilla) walk the target's next B-1 tokens, the
drafter's proposal for the same slots, and how many were accepted. Layout:
docs/results-schema.md, `samples`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

SAMPLE_PROMPTS = 3
SAMPLE_ROUNDS = 4

Decode = Callable[[list[int]], str]


def tokenizer_decoder(tokenizer: Any) -> Decode:
    """Token ids → text, special tokens kept (a drafted mask or EOS should show)."""
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)


def draft_sample(
    prompt_id: str,
    tokens: Sequence[int],
    first_anchor: int,
    completion_end: int,
    anchors: Sequence[int],
    accepted: Sequence[int],
    draft: Callable[[int], list[int]],
    block_size: int,
    decode: Decode,
) -> dict[str, Any]:
    """One prompt's sample. tokens: prompt + reference, the completion being
    tokens[first_anchor:completion_end]; `anchors`/`accepted`: the walk's rounds (acc per
    round); `draft(anchor)`: the drafter's greedy proposal for slots 1..B-1."""
    rounds = []
    for anchor, acc in list(zip(anchors, accepted, strict=True))[:SAMPLE_ROUNDS]:
        rounds.append(
            {
                "position": anchor - first_anchor,
                "anchor": decode([tokens[anchor]]),
                "target": decode(list(tokens[anchor + 1 : anchor + block_size])),
                "draft": decode(draft(anchor)),
                "accepted": acc,
            }
        )
    shown = min(first_anchor + SAMPLE_ROUNDS * block_size, completion_end)
    return {
        "id": prompt_id,
        "completion_start": decode(list(tokens[first_anchor:shown])),
        "rounds": rounds,
    }
