"""Acceptance walks, DDTree trees and the metric summary on crafted predictions."""

from __future__ import annotations

import math

import torch
from dflash_eval.metrics import Span, ddtree_depths, ddtree_pop_order, summarize, walk_prompt

from .live_loops import build_tree

# Three draft slots, three candidates each (ids and probabilities, best first).
IDS = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
PROBS = [[0.6, 0.3, 0.1], [0.55, 0.35, 0.1], [0.9, 0.05, 0.05]]
LOGPROBS = [[math.log(p) for p in slot] for slot in PROBS]


def test_ddtree_pops_nodes_best_first_as_computed_by_hand():
    # Path probabilities: (0)=.6, (0,0)=.33, (1)=.3, (0,0,0)=.297, (0,1)=.21,
    # (0,1,0)=.189, (1,0)=.165, (1,0,0)=.1485, (1,1)=.105.
    order = ddtree_pop_order(LOGPROBS, 9)
    assert sorted(order, key=order.get) == [
        (0,),
        (0, 0),
        (1,),
        (0, 0, 0),
        (0, 1),
        (0, 1, 0),
        (1, 0),
        (1, 0, 0),
        (1, 1),
    ]


def test_ddtree_accepted_depth_per_budget():
    budgets = [1, 2, 3, 4, 5, 6, 7, 8]
    # g = 10, 21, 30 → nodes (0), (0,1), (0,1,0) popped 0th, 4th, 5th.
    assert ddtree_depths(IDS, LOGPROBS, [10, 21, 30], budgets) == {
        1: 1,
        2: 1,
        3: 1,
        4: 1,
        5: 2,
        6: 3,
        7: 3,
        8: 3,
    }
    # g = 11, 20, 30 → (1), (1,0), (1,0,0) popped 2nd, 6th, 7th.
    assert ddtree_depths(IDS, LOGPROBS, [11, 20, 30], budgets) == {
        1: 0,
        2: 0,
        3: 1,
        4: 1,
        5: 1,
        6: 1,
        7: 2,
        8: 3,
    }
    # A token outside the candidates ends the path.
    assert ddtree_depths(IDS, LOGPROBS, [99, 20, 30], budgets) == dict.fromkeys(budgets, 0)
    # Fewer known future tokens than slots (end of the completion).
    assert ddtree_depths(IDS, LOGPROBS, [10], [8]) == {8: 1}


class FixedPredictions:
    """Predictions from a table: every anchor drafts the same candidates."""

    def __init__(self, ids, logprobs):
        self._ids, self._logprobs = ids, logprobs

    def _ids_at(self, anchor):
        return self._ids[anchor] if isinstance(self._ids, dict) else self._ids

    def draft(self, anchor):
        return [slot[0] for slot in self._ids_at(anchor)]

    def tree(self, anchor):
        return self._ids_at(anchor), self._logprobs


# Prompt [1, 2]; max_new_tokens 6: the completion is positions 2..7 and the reference runs
# a block (B = 4) further, to position 11. A round starts while its anchor is below 8.
TOKENS = [1, 2, 5, 10, 20, 30, 10, 20, 40, 10, 50, 60]
SPAN = Span(first_anchor=2, limit=8)


def test_the_last_round_is_not_capped_and_per_position_rates():
    drafts = {
        2: [[10], [20], [30]],  # all 3 accepted → commits 4 → next anchor 6
        6: [[20], [99], [10]],  # slot 1 right, slot 2 wrong → commits 2, past the limit
    }
    walked = walk_prompt(FixedPredictions(drafts, None), TOKENS, SPAN, 4)
    assert walked.lengths == [4, 2]  # z-lab's loop: position 8 > 7 was verified too
    assert walked.anchors == [2, 6]
    assert walked.capped_lengths == [4, 1]  # the previous convention stopped at position 7
    assert walked.slot_correct == [[True, True, True], [True, False, True]]
    summary = summarize([walked], 4, [])
    assert summary["tau_convention"] == "zlab-live-loop"
    assert summary["tau_pooled"] == summary["tau_macro"] == 3
    assert summary["capped"]["tau_macro"] == 2.5 and summary["capped"]["rounds"] == 2
    assert summary["histogram"] == {"1": 0, "2": 1, "3": 0, "4": 1}
    rates = {row["position"]: row for row in summary["per_position"]}
    assert sorted(rates) == [1, 2, 3]
    assert rates[1]["unconditional"] == 1.0 and rates[1]["conditional"] == 1.0
    assert rates[2]["unconditional"] == 0.5 and rates[2]["conditional"] == 0.5
    # Slot 3: correct in both rounds, but only the first had slots 1..2 right.
    assert rates[3]["unconditional"] == 1.0 and rates[3]["conditional_rounds"] == 1


def test_a_round_is_anchored_at_the_last_completion_token():
    drafts = {
        2: [[10], [20], [30]],  # commits 4 → anchor 6
        6: [[99], [40], [10]],  # commits 1 → anchor 7, the last completion token
        7: [[40], [10], [77]],  # commits 3 (positions 8, 9 and the bonus at 10)
    }
    walked = walk_prompt(FixedPredictions(drafts, None), TOKENS, SPAN, 4)
    assert walked.lengths == [4, 1, 3]
    assert walked.capped_lengths == [4, 1]  # the previous convention skipped anchor 7
    assert walked.reference_complete


def test_the_round_that_commits_a_stop_token_is_the_last_and_counts_in_full():
    drafts = {2: [[10], [20], [30]], 6: [[20], [40], [10]]}
    predictions = FixedPredictions(drafts, None)
    # Stop token at position 5: the first round commits it (and position 6 after it).
    walked = walk_prompt(predictions, TOKENS, Span(2, 8, stop=5), 4)
    assert walked.lengths == [4] and walked.capped_lengths == [3]
    # The first completion token is a stop token: z-lab's loop still runs one round.
    walked = walk_prompt(predictions, TOKENS, Span(2, 8, stop=2), 4)
    assert walked.lengths == [4] and walked.capped_lengths == []
    # A stop past the limit changes nothing.
    walked = walk_prompt(predictions, TOKENS, Span(2, 8, stop=9), 4)
    assert walked.lengths == [4, 4]


def test_max_rounds_keeps_exactly_the_first_rounds():
    ids = {anchor: [[t] for t in TOKENS[anchor + 1 : anchor + 4]] for anchor in range(2, 11)}
    ids[2] = [[0], [0], [0]]
    predictions = FixedPredictions(ids, [[0.0]] * 3)
    full = walk_prompt(predictions, TOKENS, SPAN, 4, [1, 2])
    assert full.lengths == [1, 4, 4]
    for max_rounds in range(5):
        cut = walk_prompt(predictions, TOKENS, SPAN, 4, [1, 2], max_rounds)
        assert cut.lengths == full.lengths[:max_rounds]
        assert cut.anchors == full.anchors[:max_rounds]
        assert cut.capped_lengths == full.capped_lengths[:max_rounds]
        for budget in (1, 2):
            assert cut.ddtree_lengths[budget] == full.ddtree_lengths[budget][:max_rounds]


def test_a_short_reference_is_flagged_not_crashed_on():
    drafts = {2: [[10], [20], [30]], 6: [[20], [40]]}
    walked = walk_prompt(FixedPredictions(drafts, None), TOKENS[:8], SPAN, 4)
    assert not walked.reference_complete
    assert walked.lengths == [4, 2]
    assert summarize([walked], 4, [])["incomplete_references"] == 1
    assert walk_prompt(FixedPredictions(drafts, None), TOKENS, SPAN, 4).reference_complete


def test_tau_macro_averages_prompts_and_pooled_averages_rounds():
    guesses = FixedPredictions({2: [[9], [9], [9]]}, None)
    short = walk_prompt(guesses, [1, 2, 3, 4, 5], Span(2, 3), 4)
    long = walk_prompt(
        FixedPredictions({2: [[3], [4], [5]], 6: [[7], [8], [9]]}, None),
        [1, 2, 0, 3, 4, 5, 0, 7, 8, 9, 0],
        Span(2, 8),
        4,
    )
    assert short.lengths == [1]
    assert long.lengths == [4, 4]
    summary = summarize([short, long], 4, [])
    assert summary["tau_macro"] == (1 + 4) / 2
    assert summary["tau_pooled"] == 9 / 3


def test_ddtree_walk_uses_tree_lengths_and_grows_with_budget():
    tokens = [1, 2, 5, 11, 20, 30, 7, 10, 21, 30, 8]
    predictions = FixedPredictions(IDS, LOGPROBS)
    walked = walk_prompt(predictions, tokens, Span(2, 8), 4, budgets=[1, 3, 8])
    # One node: only g = 10 in slot 1 is accepted (at anchor 6).
    assert walked.ddtree_lengths[1] == [1, 1, 1, 1, 2]
    assert walked.ddtree_lengths[8][:1] == [4]  # 11, 20, 30 is in the 8-node tree
    summary = summarize([walked], 4, [1, 3, 8])
    taus = [summary["ddtree"][str(b)]["tau_pooled"] for b in (1, 3, 8)]
    assert taus == sorted(taus) and taus[-1] > taus[0]
    assert summary["capped"]["ddtree"]["1"]["rounds"] == 5  # anchors 2..6, the last capped


# Exact ties (these sums are exact in floats): after (0,) at -1, the paths (0,0), (0,1), (1,)
# and (2,) all score -2, then (0,0,0) and (0,1,0) -2.5, then (0,2), (1,0), (2,0), (3,) -3.
# The DDTree authors' heap compares (-score, rank tuple), so a tie pops the smaller rank
# tuple first, whatever order the candidates were pushed in ((1,) is pushed before (0,0)).
TIED = [[-1.0, -2.0, -2.0, -3.0], [-1.0, -1.0, -2.0, -2.5], [-0.5, -1.5, -1.5, -4.0]]


def test_ddtree_exact_ties_pop_the_smaller_rank_tuple_first():
    order = ddtree_pop_order(TIED, 9)
    assert sorted(order, key=order.get) == [
        (0,),
        (0, 0),
        (0, 1),
        (1,),
        (2,),
        (0, 0, 0),
        (0, 1, 0),
        (0, 2),
        (1, 0),
    ]
    # The accepted depth follows: the path 11, 20 is (1,), (1, 0), pop indices 3 and 8.
    ids = [[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]]
    assert ddtree_depths(ids, TIED, [11, 20, 99], [3, 4, 8, 9]) == {3: 0, 4: 1, 8: 1, 9: 2}


def test_ddtree_tree_equals_the_reference_construction_for_every_budget():
    generator = torch.Generator().manual_seed(3)
    for trial in range(40):
        # Coarse values (multiples of 1/4) make exact ties between paths common.
        values = -torch.randint(0, 12, (5, 40), generator=generator).float() / 4
        table = torch.sort(values, dim=-1, descending=True).values
        for budget in (1, 3, 4, 8, 16, 32):
            expected = build_tree(table, budget)
            order = ddtree_pop_order(table[:, :32].tolist(), 32)
            assert sorted(order, key=order.get)[:budget] == expected, (trial, budget)
