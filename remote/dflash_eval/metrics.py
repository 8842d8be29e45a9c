"""Acceptance metrics (DFLASH.md §3–4), computed by walking a completion offline.

A round at anchor s (g[s] the last committed token) drafts slots 1..B-1; the target accepts
the longest prefix equal to g[s+1..]; the round commits acc+1 tokens and the next anchor
is s+acc+1. The walk starts at the first completion token (anchor = prompt length) and ends
at the last token of the completion. Only the m = min(B-1, N-1-s) slots that have a known
g are checked, and the last round commits at most N-1-s tokens (the completion ends there,
as a live loop capped at max_new_tokens would).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class Predictions(Protocol):
    """What the walk reads per anchor (predict.Predictor): the greedy draft of slots
    1..B-1, and the top-k candidates (ids, log-probs) of the slots a tree can reach."""

    def draft(self, anchor: int) -> list[int]: ...

    def tree(self, anchor: int) -> tuple[list[list[int]], list[list[float]]]: ...


@dataclass
class PromptWalk:
    """The rounds of one completion."""

    lengths: list[int] = field(default_factory=list)  # vanilla acc+1 per round
    slot_correct: list[list[bool]] = field(default_factory=list)  # per round, slots 1..m
    ddtree_lengths: dict[int, list[int]] = field(default_factory=dict)


def accepted_prefix(draft: Sequence[int], future: Sequence[int]) -> tuple[int, list[bool]]:
    """(acc, per-slot correctness) for drafts vs the true next tokens (checked slots only)."""
    correct = [d == g for d, g in zip(draft, future, strict=False)]
    acc = next((k for k, ok in enumerate(correct) if not ok), len(correct))
    return acc, correct


def walk(
    first_anchor: int,
    num_tokens: int,
    round_length: Callable[[int], int],
    max_rounds: int | None = None,
) -> list[int]:
    """Round lengths from anchor `first_anchor` to the end of a num_tokens sequence."""
    lengths = []
    anchor = first_anchor
    while anchor < num_tokens - 1 and (max_rounds is None or len(lengths) < max_rounds):
        length = round_length(anchor)
        lengths.append(length)
        anchor += length
    return lengths


def ddtree_pop_order(
    logprobs: Sequence[Sequence[float]], max_nodes: int
) -> dict[tuple[int, ...], int]:
    """Best-first draft tree (DFLASH.md §4): node = ranks along a path (slot 1, 2, …).

    Max-heap on the summed log-prob of the path; start with (slot 1, rank 0); each pop adds
    the node and pushes its next sibling (same slot, next rank) and first child (next
    slot, rank 0). Returns node → pop index; the tree of budget b is the nodes with index
    < b, so one expansion serves every budget ≤ max_nodes.
    """
    slots, width = len(logprobs), len(logprobs[0])
    order: dict[tuple[int, ...], int] = {}
    # Entries: (-path score, tie-break counter, node, score of the node's parent path).
    heap = [(-logprobs[0][0], 0, (0,), 0.0)]
    counter = 1
    while heap and len(order) < max_nodes:
        negative, _, node, parent_score = heapq.heappop(heap)
        order[node] = len(order)
        depth, rank = len(node), node[-1]
        if rank + 1 < width:
            sibling_score = parent_score + logprobs[depth - 1][rank + 1]
            heapq.heappush(heap, (-sibling_score, counter, (*node[:-1], rank + 1), parent_score))
            counter += 1
        if depth < slots:
            child_score = -negative + logprobs[depth][0]
            heapq.heappush(heap, (-child_score, counter, (*node, 0), -negative))
            counter += 1
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
    first_anchor: int,
    block_size: int,
    budgets: Sequence[int] = (),
    max_rounds: int | None = None,
) -> PromptWalk:
    """Vanilla and DDTree walks over one completion."""
    result = PromptWalk()
    num_tokens = len(tokens)

    def vanilla(anchor: int) -> int:
        future = tokens[anchor + 1 : anchor + block_size]
        acc, correct = accepted_prefix(predictions.draft(anchor), future)
        result.slot_correct.append(correct)
        return min(acc + 1, num_tokens - 1 - anchor)

    result.lengths = walk(first_anchor, num_tokens, vanilla, max_rounds)
    tree_paths: dict[int, list[int]] = {}  # anchor → path indices, shared by all budgets

    def tree_length(anchor: int, budget: int) -> int:
        if anchor not in tree_paths:
            tree_paths[anchor] = ddtree_path_indices(
                *predictions.tree(anchor),
                tokens[anchor + 1 : anchor + block_size],
                max(budgets),
            )
        depth = sum(1 for index in tree_paths[anchor] if index < budget)
        return min(depth + 1, num_tokens - 1 - anchor)

    for budget in budgets:
        result.ddtree_lengths[budget] = walk(
            first_anchor, num_tokens, lambda anchor, b=budget: tree_length(anchor, b), max_rounds
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


def summarize(
    walks: Sequence[PromptWalk], block_size: int, budgets: Sequence[int]
) -> dict[str, Any]:
    """The metrics block of the results JSON (see docs/results-schema.md)."""
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
        "tau_macro": vanilla["macro"],
        "tau_pooled": vanilla["pooled"],
        "rounds": vanilla["rounds"],
        "committed_tokens": vanilla["committed_tokens"],
        "histogram": histogram,
        "per_position": per_position,
        "ddtree": {
            str(b): {
                "tau_macro": t["macro"],
                "tau_pooled": t["pooled"],
                "rounds": t["rounds"],
                "committed_tokens": t["committed_tokens"],
            }
            for b in budgets
            for t in [tau([w.ddtree_lengths[b] for w in walks])]
        },
    }


def _rate(hits: int, total: int) -> float | None:
    return hits / total if total else None
