"""A few decoded drafts per run, so that what the drafter proposes is visible at a glance.

SAMPLE_PROMPTS prompts, taken in turn from each named set (the first prompts when there are
none): the start of the target's completion as text, and SAMPLE_ROUNDS rounds of the
(vanilla) walk with the target's next B-1 tokens, the drafter's proposal for the same slots
(as text and token by token) and how many were accepted. The rounds are the ones at the
quartiles of the prompt's accepted counts, so a sample looks like the prompt's typical round
(the first rounds of a completion are often its hardest). Layout: docs/results-schema.md,
`samples`.
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


def sampled_prompts(datasets: Sequence[str | None]) -> set[int]:
    """Indices of the prompts to sample, given each prompt's set: the first of each set,
    then the second of each, … until SAMPLE_PROMPTS are chosen."""
    by_set: dict[str | None, list[int]] = {}
    for index, name in enumerate(datasets):
        by_set.setdefault(name, []).append(index)
    chosen: list[int] = []
    for rank in range(max((len(v) for v in by_set.values()), default=0)):
        chosen += [indices[rank] for indices in by_set.values() if rank < len(indices)]
    return set(chosen[:SAMPLE_PROMPTS])


def typical_rounds(accepted: Sequence[int]) -> list[int]:
    """Indices of up to SAMPLE_ROUNDS rounds at the quartiles of the accepted counts (ties
    broken by walk order), in walk order."""
    ranked = sorted(range(len(accepted)), key=lambda i: (accepted[i], i))
    count = min(SAMPLE_ROUNDS, len(ranked))
    return sorted({ranked[(2 * k + 1) * len(ranked) // (2 * count)] for k in range(count)})


def draft_sample(
    prompt_id: str,
    dataset: str | None,
    tokens: Sequence[int],
    span: tuple[int, int],
    anchors: Sequence[int],
    accepted: Sequence[int],
    draft: Callable[[int], list[int]],
    block_size: int,
    decode: Decode,
) -> dict[str, Any]:
    """One prompt's sample. tokens: prompt + reference, the completion being
    tokens[first:end] for span = (first, end); `anchors`/`accepted`: the walk's rounds (acc
    per round); `draft(anchor)`: the drafter's greedy proposal for slots 1..B-1."""
    first_anchor, completion_end = span
    rounds = []
    for index in typical_rounds(accepted):
        anchor = anchors[index]
        target = list(tokens[anchor + 1 : anchor + block_size])
        proposal = draft(anchor)
        rounds.append(
            {
                "position": anchor - first_anchor,
                "anchor": decode([tokens[anchor]]),
                "target": decode(target),
                "draft": decode(proposal),
                "accepted": accepted[index],
                "target_tokens": [decode([token]) for token in target],
                "draft_tokens": [decode([token]) for token in proposal],
            }
        )
    shown = min(first_anchor + SAMPLE_ROUNDS * block_size, completion_end)
    sample: dict[str, Any] = {
        "id": prompt_id,
        "completion_start": decode(list(tokens[first_anchor:shown])),
        "rounds": rounds,
    }
    if dataset is not None:
        sample["dataset"] = dataset
    return sample
