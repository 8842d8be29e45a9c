"""Acceptance metrics (dflash-spec.md §3–4), computed by walking a completion offline.

A round at anchor s (g[s] the last committed token) drafts slots 1..B-1; the target accepts
the longest prefix equal to g[s+1..]; the round commits acc+1 tokens and the next anchor
is s+acc+1. Where the walk ends follows one of two versions of z-lab's `dflash_generate`
(`dflash/model.py`), both reported:

- "zlab-live-loop", the default (the figures at the top of `metrics`): the loop of commit
  7d2ea1e9828b (z-lab's main branch up to 44947fb, and the DDTree authors'
  `ddtree_generate`), whose acceptance lengths the published benchmarks average. The first
  round is anchored at the first completion token; a round starts while the anchor is below
  prompt length + max_new_tokens (so the round at the last completion token runs too); every
  round verifies a whole block and none is capped (the output is cut afterwards, the
  acceptance lengths are not); the round that commits the first stop token is the last one,
  and counts in full.
- "zlab-07ebd93" (`metrics.capped`): the loop of commit 07ebd93db9f4. Rounds run while
  anchor + 1 < max_length (prompt length + max_new_tokens), and none when the first
  completion token is a stop token; the last block is shortened to min(B, max_length − s)
  slots (the drafter sees fewer mask slots, which changes its predictions wherever a layer is
  not causal); a round's count is capped at max_length − s − 1, and cut after the first stop
  token it commits.

Scoring the default's last rounds exactly needs the target's greedy tokens up to B-1 past the
last anchor, past max_new_tokens and past a stop token: the reference ("tokens") is generated
that much longer (reference/completions.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dflash_eval.contract.schema_metrics import Metrics

# The value of metrics.tau_convention (docs/results-schema.md), and of metrics.capped's.
TAU_CONVENTION = "zlab-live-loop"
CURRENT_CONVENTION = "zlab-07ebd93"
# metrics.conventions: each convention named with the reference commit it follows.
CONVENTIONS = {
    TAU_CONVENTION: "z-lab dflash/model.py dflash_generate at 7d2ea1e9828b: rounds start while "
    "the anchor is below max_length, whole blocks, no cap (the default)",
    CURRENT_CONVENTION: "z-lab dflash/model.py dflash_generate at 07ebd93db9f4: rounds run "
    "while anchor + 1 < max_length, the last block shortened to what is left, its count capped",
}


class Predictions(Protocol):
    """What the walk reads per anchor (predict.Predictor): the greedy draft of slots
    1..B-1, and the top-k candidates (ids, log-probs) of the slots a tree can reach."""

    def draft(self, anchor: int, size: int | None = None) -> list[int]: ...

    def tree(
        self, anchor: int, size: int | None = None
    ) -> tuple[list[list[int]], list[list[float]]]: ...


@dataclass(frozen=True)
class Span:
    """Where the rounds of one completion run, in absolute positions of prompt + reference.

    first_anchor: the first completion token (the prompt length); limit: a round starts
    only below it (prompt length + max_new_tokens); stop: the position of the first stop
    token in the reference, if the target emitted one.
    """

    first_anchor: int
    limit: int
    stop: int | None = None

    @property
    def end(self) -> int:
        """End (exclusive) of the live loop's output: max_new_tokens, or the stop token."""
        return self.limit if self.stop is None else min(self.limit, self.stop + 1)

    def needed_tokens(self, block_size: int) -> int:
        """Reference length (prompt included) that decides every round exactly: B-1 known
        tokens after the last anchor a round can start at."""
        last_start = self.limit if self.stop is None else min(self.limit, self.stop)
        last_anchor = max(last_start - 1, self.first_anchor)
        return last_anchor + block_size


@dataclass
class PromptWalk:
    """The rounds of one completion."""

    lengths: list[int] = field(default_factory=list)  # vanilla acc+1 per round
    anchors: list[int] = field(default_factory=list)  # vanilla round anchors
    slot_correct: list[list[bool]] = field(default_factory=list)  # per round, slots 1..B-1
    ddtree_lengths: dict[int, list[int]] = field(default_factory=dict)
    capped_lengths: list[int] = field(default_factory=list)  # CURRENT_CONVENTION
    capped_ddtree_lengths: dict[int, list[int]] = field(default_factory=dict)
    reference_complete: bool = True  # False: the reference was too short to decide the end


def accepted_prefix(draft: Sequence[int], future: Sequence[int]) -> tuple[int, list[bool]]:
    """(acc, per-slot correctness) for drafts vs the true next tokens (known slots only)."""
    correct = [d == g for d, g in zip(draft, future, strict=False)]
    acc = next((k for k, ok in enumerate(correct) if not ok), len(correct))
    return acc, correct


def walk(
    first_anchor: int,
    limit: int,
    round_length: Callable[[int], int],
    stop: int | None = None,
    max_rounds: int | None = None,
) -> list[int]:
    """Round lengths: a round starts while the anchor is below `limit` (and fewer than
    max_rounds ran); the round that commits position `stop` (anchor + length ≥ stop) is
    the last, as in z-lab's loop, which looks for a stop token after each round."""
    lengths: list[int] = []
    anchor = first_anchor
    while anchor < limit and (max_rounds is None or len(lengths) < max_rounds):
        length = round_length(anchor)
        lengths.append(length)
        anchor += length
        if stop is not None and stop <= anchor:
            break
    return lengths


def walk_current(
    first_anchor: int,
    max_length: int,
    block_size: int,
    round_length: Callable[[int, int], int],
    stop: int | None = None,
    max_rounds: int | None = None,
) -> list[int]:
    """Round counts of z-lab's loop at 07ebd93: `round_length(anchor, size)` is acc+1 for a
    block of `size` slots (B, or what is left before max_length)."""
    lengths: list[int] = []
    anchor = first_anchor
    if stop == first_anchor:
        return lengths  # the token before the first round is already a stop token
    while anchor + 1 < max_length and (max_rounds is None or len(lengths) < max_rounds):
        size = min(block_size, max_length - anchor)
        produced = min(round_length(anchor, size), max_length - anchor - 1)
        if stop is not None and anchor < stop <= anchor + produced:
            lengths.append(stop - anchor)
            break
        lengths.append(produced)
        anchor += produced
    return lengths


def anchors_of(first_anchor: int, lengths: Sequence[int]) -> list[int]:
    """The anchor of each round of a walk with these round lengths."""
    anchors = [first_anchor]
    for length in lengths[:-1]:
        anchors.append(anchors[-1] + length)
    return anchors[: len(lengths)]


def ddtree_pop_order(
    logprobs: Sequence[Sequence[float]], max_nodes: int
) -> dict[tuple[int, ...], int]:
    """Best-first draft tree (dflash-spec.md §4) as the DDTree authors' `build_ddtree_tree`
    builds it: node = ranks along a path (slot 1, 2, …).

    Max-heap on the summed log-prob of the path; start with (slot 1, rank 0); each pop adds
    the node and pushes its next sibling (same slot, next rank) and its first child (next
    slot, rank 0). Exact ties pop the smaller rank tuple first (the heap entries compare
    (-score, ranks) there), and scores are summed in the same order (a sibling's score is
    the node's minus its own log-prob plus the sibling's), so even float rounding agrees.
    Returns node → pop index; the tree of budget b is the nodes with index < b, so one
    expansion serves every budget ≤ max_nodes (a node of rank r is popped after its r
    elder siblings, so ranks ≥ b, which a b-wide top-k lacks, never pop among b nodes).
    """
    slots, width = len(logprobs), len(logprobs[0])
    order: dict[tuple[int, ...], int] = {}
    first = float(logprobs[0][0])
    heap: list[tuple[float, tuple[int, ...], float]] = [(-first, (0,), first)]
    while heap and len(order) < max_nodes:
        _, ranks, score = heapq.heappop(heap)
        order[ranks] = len(order)
        depth, rank = len(ranks), ranks[-1]
        if rank + 1 < width:
            row = logprobs[depth - 1]
            sibling = score - float(row[rank]) + float(row[rank + 1])
            heapq.heappush(heap, (-sibling, (*ranks[:-1], rank + 1), sibling))
        if depth < slots:
            child = score + float(logprobs[depth][0])
            heapq.heappush(heap, (-child, (*ranks, 0), child))
    return order


def ddtree_path_indices(
    ids: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]],
    future: Sequence[int],
    max_nodes: int,
) -> list[int]:
    """Pop indices of the prefixes of the true continuation `future` that are in the tree
    (stopping at the first absent one). A child is popped after its parent, so the indices
    increase along the path: the accepted depth for budget b is how many are < b."""
    order = ddtree_pop_order(logprobs, max_nodes)
    indices = []
    ranks: tuple[int, ...] = ()
    for slot, token in enumerate(future[: len(ids)]):
        if token not in ids[slot]:
            break
        ranks = (*ranks, ids[slot].index(token))
        if ranks not in order:
            break
        indices.append(order[ranks])
    return indices


def ddtree_depths(
    ids: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]],
    future: Sequence[int],
    budgets: Sequence[int],
) -> dict[int, int]:
    """Accepted depth per budget: the longest prefix of `future` that is a path in the tree."""
    indices = ddtree_path_indices(ids, logprobs, future, max(budgets))
    return {b: sum(1 for index in indices if index < b) for b in budgets}


def walk_prompt(
    predictions: Predictions,
    tokens: Sequence[int],
    span: Span,
    block_size: int,
    budgets: Sequence[int] = (),
    max_rounds: int | None = None,
) -> PromptWalk:
    """Vanilla and DDTree walks over one completion, in both conventions.

    tokens: prompt + reference. An anchor needs its own token and at least one known
    token after it, so a reference shorter than span.needed_tokens ends the walk early
    (reference_complete is then False and the last rounds may be underestimated).
    """
    result = PromptWalk(reference_complete=len(tokens) >= span.needed_tokens(block_size))
    limit = min(span.limit, len(tokens) - 1)
    max_length = min(span.limit, len(tokens))  # the current loop's, within the reference
    checked: dict[tuple[int, int], tuple[int, list[bool]]] = {}  # (anchor, size) → acc, slots

    def vanilla(anchor: int, size: int = block_size) -> int:
        if (anchor, size) not in checked:
            future = tokens[anchor + 1 : anchor + size]
            draft = predictions.draft(anchor, size if size < block_size else None)
            checked[anchor, size] = accepted_prefix(draft, future)
        return checked[anchor, size][0]

    result.lengths = walk(span.first_anchor, limit, lambda a: vanilla(a) + 1, span.stop, max_rounds)
    result.anchors = anchors_of(span.first_anchor, result.lengths)
    result.slot_correct = [checked[anchor, block_size][1] for anchor in result.anchors]
    result.capped_lengths = walk_current(
        span.first_anchor,
        max_length,
        block_size,
        lambda a, size: vanilla(a, size) + 1,
        span.stop,
        max_rounds,
    )
    tree_paths: dict[tuple[int, int], list[int]] = {}  # path indices, shared by all budgets

    def tree_depth(anchor: int, budget: int, size: int = block_size) -> int:
        if (anchor, size) not in tree_paths:
            future = tokens[anchor + 1 : anchor + size]
            tree = predictions.tree(anchor, size if size < block_size else None)
            tree_paths[anchor, size] = ddtree_path_indices(*tree, future, max(budgets))
        return sum(1 for index in tree_paths[anchor, size] if index < budget)

    for b in budgets:
        result.ddtree_lengths[b] = walk(
            span.first_anchor, limit, lambda a, b=b: tree_depth(a, b) + 1, span.stop, max_rounds
        )
        result.capped_ddtree_lengths[b] = walk_current(
            span.first_anchor,
            max_length,
            block_size,
            lambda a, size, b=b: tree_depth(a, b, size) + 1,
            span.stop,
            max_rounds,
        )
    return result


def tau(lengths_per_prompt: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Macro (mean per prompt, then over prompts) and pooled (tokens / rounds) τ."""
    walked = [lengths for lengths in lengths_per_prompt if lengths]
    rounds = sum(len(lengths) for lengths in walked)
    committed = sum(sum(lengths) for lengths in walked)
    return {
        "macro": sum(sum(x) / len(x) for x in walked) / len(walked) if walked else None,
        "pooled": committed / rounds if rounds else None,
        "rounds": rounds,
        "committed_tokens": committed,
    }


def summarize(walks: Sequence[PromptWalk], block_size: int, budgets: Sequence[int]) -> Metrics:
    """The metrics block of the results (schema_metrics.Metrics)."""
    vanilla = tau([w.lengths for w in walks])
    histogram = {str(n): 0 for n in range(1, block_size + 1)}
    for w in walks:
        for length in w.lengths:
            histogram[str(length)] += 1
    per_position = []
    for k in range(1, block_size):
        checked = [c for w in walks for c in w.slot_correct if len(c) >= k]
        prefix_ok = [c for c in checked if all(c[: k - 1])]
        per_position.append(
            {
                "position": k,
                "conditional": _rate(sum(c[k - 1] for c in prefix_ok), len(prefix_ok)),
                "unconditional": _rate(sum(c[k - 1] for c in checked), len(checked)),
                "conditional_rounds": len(prefix_ok),
                "rounds": len(checked),
            }
        )
    return {
        "block_size": block_size,
        "tau_convention": TAU_CONVENTION,
        "conventions": CONVENTIONS,
        "tau_macro": vanilla["macro"],
        "tau_pooled": vanilla["pooled"],
        "rounds": vanilla["rounds"],
        "committed_tokens": vanilla["committed_tokens"],
        "histogram": histogram,
        "per_position": per_position,
        "ddtree": _ddtree_block([w.ddtree_lengths for w in walks], budgets),
        "capped": {
            "tau_convention": CURRENT_CONVENTION,
            **_tau_block([w.capped_lengths for w in walks]),
            "ddtree": _ddtree_block([w.capped_ddtree_lengths for w in walks], budgets),
        },
        "incomplete_references": sum(not w.reference_complete for w in walks),
    }


def _tau_block(lengths_per_prompt: Sequence[Sequence[int]]) -> dict[str, Any]:
    t = tau(lengths_per_prompt)
    return {
        "tau_macro": t["macro"],
        "tau_pooled": t["pooled"],
        "rounds": t["rounds"],
        "committed_tokens": t["committed_tokens"],
    }


def _ddtree_block(
    lengths_per_prompt: Sequence[dict[int, list[int]]], budgets: Sequence[int]
) -> dict[str, Any]:
    return {str(b): _tau_block([lengths[b] for lengths in lengths_per_prompt]) for b in budgets}


def _rate(hits: int, total: int) -> float | None:
    return hits / total if total else None
