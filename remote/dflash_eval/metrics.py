"""Acceptance metrics (DFLASH.md §3–4), computed by walking a completion offline.

A round at anchor s (g[s] the last committed token) drafts slots 1..B-1; the target accepts
the longest prefix equal to g[s+1..]; the round commits acc+1 tokens and the next anchor
is s+acc+1. The rounds are those of z-lab's `dflash_generate` (and of the DDTree authors'
`ddtree_generate`), the loops whose mean acceptance length their benchmarks report:

- the first round is anchored at the first completion token (anchor = prompt length);
- a round starts while the anchor is below prompt length + max_new_tokens, so the round
  anchored at the last completion token runs too;
- no round is capped at the tokens left: the live loop verifies a whole block and may
  accept past max_new_tokens (its output is cut afterwards, its acceptance lengths are not);
- the round that commits the first stop token is the last one, and counts in full.

Scoring the last rounds exactly needs the target's greedy tokens up to B-1 past the last
anchor, past max_new_tokens and past a stop token: the reference ("tokens") is generated
that much longer (completions.py). The previous convention, capped at the end of the
completion, is kept as a secondary figure (`capped_*`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dflash_eval.schema_metrics import Metrics

# The value of metrics.tau_convention (docs/results-schema.md).
TAU_CONVENTION = "zlab-live-loop"


class Predictions(Protocol):
    """What the walk reads per anchor (predict.Predictor): the greedy draft of slots
    1..B-1, and the top-k candidates (ids, log-probs) of the slots a tree can reach."""

    def draft(self, anchor: int) -> list[int]: ...

    def tree(self, anchor: int) -> tuple[list[list[int]], list[list[float]]]: ...


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
    capped_lengths: list[int] = field(default_factory=list)  # the previous convention
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


def anchors_of(first_anchor: int, lengths: Sequence[int]) -> list[int]:
    """The anchor of each round of a walk with these round lengths."""
    anchors = [first_anchor]
    for length in lengths[:-1]:
        anchors.append(anchors[-1] + length)
    return anchors[: len(lengths)]


def ddtree_pop_order(
    logprobs: Sequence[Sequence[float]], max_nodes: int
) -> dict[tuple[int, ...], int]:
    """Best-first draft tree (DFLASH.md §4) as the DDTree authors' `build_ddtree_tree`
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
    capped_last = min(span.end, len(tokens)) - 1  # the previous convention's last token
    checked: dict[int, tuple[int, list[bool]]] = {}  # anchor → (acc, per-slot correctness)

    def vanilla(anchor: int) -> int:
        if anchor not in checked:
            future = tokens[anchor + 1 : anchor + block_size]
            checked[anchor] = accepted_prefix(predictions.draft(anchor), future)
        return checked[anchor][0]

    result.lengths = walk(span.first_anchor, limit, lambda a: vanilla(a) + 1, span.stop, max_rounds)
    result.anchors = anchors_of(span.first_anchor, result.lengths)
    result.slot_correct = [checked[anchor][1] for anchor in result.anchors]
    result.capped_lengths = walk(
        span.first_anchor,
        capped_last,
        lambda a: min(vanilla(a) + 1, capped_last - a),
        max_rounds=max_rounds,
    )
    tree_paths: dict[int, list[int]] = {}  # anchor → path indices, shared by all budgets

    def tree_depth(anchor: int, budget: int) -> int:
        if anchor not in tree_paths:
            future = tokens[anchor + 1 : anchor + block_size]
            tree_paths[anchor] = ddtree_path_indices(
                *predictions.tree(anchor), future, max(budgets)
            )
        return sum(1 for index in tree_paths[anchor] if index < budget)

    for b in budgets:
        result.ddtree_lengths[b] = walk(
            span.first_anchor, limit, lambda a, b=b: tree_depth(a, b) + 1, span.stop, max_rounds
        )
        result.capped_ddtree_lengths[b] = walk(
            span.first_anchor,
            capped_last,
            lambda a, b=b: min(tree_depth(a, b) + 1, capped_last - a),
            max_rounds=max_rounds,
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
        "tau_macro": vanilla["macro"],
        "tau_pooled": vanilla["pooled"],
        "rounds": vanilla["rounds"],
        "committed_tokens": vanilla["committed_tokens"],
        "histogram": histogram,
        "per_position": per_position,
        "ddtree": _ddtree_block([w.ddtree_lengths for w in walks], budgets),
        "capped": {
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
