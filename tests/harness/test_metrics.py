"""Acceptance walks, DDTree trees and the metric summary on crafted predictions."""

from __future__ import annotations

import math

from dflash_eval.metrics import ddtree_depths, ddtree_pop_order, summarize, walk_prompt

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


def test_vanilla_walk_lengths_histogram_and_per_position_rates():
    # Prompt of 2 tokens; completion g[2..9]. Block size 4: slots 1..3.
    tokens = [1, 2, 5, 10, 20, 30, 10, 20, 40, 10]
    drafts = {
        2: [[10], [20], [30]],  # all 3 accepted → commits 4 → next anchor 6
        6: [[20], [99], [10]],  # slot 1 right, slot 2 wrong → commits 2 → anchor 8
        8: [[10], [20], [30]],  # 1 known token left (g[9] = 10): accepted, capped at 1
    }
    walked = walk_prompt(FixedPredictions(drafts, None), tokens, 2, 4)
    assert walked.lengths == [4, 2, 1]
    assert walked.slot_correct == [[True, True, True], [True, False, True], [True]]
    summary = summarize([walked], 4, [])
    assert summary["tau_pooled"] == 7 / 3
    assert summary["tau_macro"] == 7 / 3
    assert summary["histogram"] == {"1": 1, "2": 1, "3": 0, "4": 1}
    rates = {row["position"]: row for row in summary["per_position"]}
    assert rates[1]["unconditional"] == 1.0 and rates[1]["conditional"] == 1.0
    assert rates[2]["unconditional"] == 0.5 and rates[2]["conditional"] == 0.5
    # Slot 3: correct in both rounds that reach it, but only the first had slots 1..2 right.
    assert rates[3]["unconditional"] == 1.0 and rates[3]["conditional_rounds"] == 1


def test_tau_macro_averages_prompts_and_pooled_averages_rounds():
    short = walk_prompt(FixedPredictions({2: [[9], [9], [9]]}, None), [1, 2, 3, 4], 2, 4)
    long = walk_prompt(
        FixedPredictions({2: [[3], [4], [5]], 6: [[7], [8], [9]]}, None),
        [1, 2, 0, 3, 4, 5, 0, 7, 8, 9],
        2,
        4,
    )
    assert short.lengths == [1]
    assert long.lengths == [4, 3]
    summary = summarize([short, long], 4, [])
    assert summary["tau_macro"] == (1 + 3.5) / 2
    assert summary["tau_pooled"] == 8 / 3


def test_ddtree_walk_uses_tree_lengths_and_grows_with_budget():
    tokens = [1, 2, 5, 11, 20, 30, 7, 10, 21, 30, 8]
    predictions = FixedPredictions(IDS, LOGPROBS)
    walked = walk_prompt(predictions, tokens, 2, 4, budgets=[1, 3, 8])
    # One node: only g = 10 in slot 1 is accepted (at anchor 6).
    assert walked.ddtree_lengths[1] == [1, 1, 1, 1, 2, 1, 1]
    assert walked.ddtree_lengths[8][:1] == [4]  # 11, 20, 30 is in the 8-node tree
    summary = summarize([walked], 4, [1, 3, 8])
    taus = [summary["ddtree"][str(b)]["tau_pooled"] for b in (1, 3, 8)]
    assert taus == sorted(taus) and taus[-1] > taus[0]
