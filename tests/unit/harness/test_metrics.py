"""Acceptance walks, DDTree trees and the metric summary on crafted predictions."""

from __future__ import annotations

import math

import torch
from dflash_eval.walk.metrics import Span, ddtree_depths, ddtree_pop_order, summarize, walk_prompt

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

    def draft(self, anchor, size=None):
        return [slot[0] for slot in self._ids_at(anchor)][: size and size - 1]

    def tree(self, anchor, size=None):
        logprobs = self._logprobs if size is None else self._logprobs[: size - 1]
        return self._ids_at(anchor)[: size and size - 1], logprobs


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
    assert walked.capped_lengths == [4, 1]  # 07ebd93's loop stops at position 7
    assert walked.slot_correct == [[True, True, True], [True, False, True]]
    summary = summarize([walked], 4, [])
    assert summary["tau_convention"] == "zlab-live-loop"
    assert summary["tau_pooled"] == summary["tau_macro"] == 3
    assert summary["capped"]["tau_macro"] == 2.5 and summary["capped"]["rounds"] == 2
    assert summary["capped"]["tau_convention"] == "zlab-07ebd93"
    assert set(summary["conventions"]) == {"zlab-live-loop", "zlab-07ebd93"}
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
    assert walked.capped_lengths == [4, 1]  # 07ebd93's loop skips anchor 7
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


class SizeAwarePredictions(FixedPredictions):
    """A shortened block drafts other tokens, as a drafter with non-causal layers does."""

    def __init__(self, ids, short_ids):
        super().__init__(ids, None)
        self._short = short_ids

    def draft(self, anchor, size=None):
        if size is None:
            return super().draft(anchor)
        return [slot[0] for slot in self._short[anchor, size]]


def test_the_current_loop_drafts_its_last_block_shortened():
    # Limit 9: after 4 tokens from anchor 2, the round at 6 has 3 slots left (2 drafted).
    full = {2: [[10], [20], [30]], 6: [[99], [99], [99]], 7: [[40], [10], [50]]}
    short = {(6, 3): [[20], [40]], (7, 2): [[40]]}
    walked = walk_prompt(SizeAwarePredictions(full, short), TOKENS, Span(2, 9), 4)
    assert walked.lengths == [4, 1, 4]  # the default loop: full blocks at 6, then at 7
    # 07ebd93: the shortened block at 6 gets both slots right (3), capped at 9 − 6 − 1 = 2.
    assert walked.capped_lengths == [4, 2]
    short[6, 3] = [[20], [99]]  # one slot right: 2, nothing to cap
    assert walk_prompt(SizeAwarePredictions(full, short), TOKENS, Span(2, 9), 4).capped_lengths == [
        4,
        2,
    ]
    short[6, 3] = [[99], [40]]  # none right: then a 2-slot block at 7, capped at 1
    assert walk_prompt(SizeAwarePredictions(full, short), TOKENS, Span(2, 9), 4).capped_lengths == [
        4,
        1,
        1,
    ]


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


# --- the limits of a walk: the last anchor, a short reference, a stop at a round's end ------


def test_needed_tokens_reach_a_block_past_the_last_anchor_a_round_can_start_at():
    # Rounds start below the limit (8) and end after the round that commits the stop token,
    # so the last anchor is 7, or stop - 1, or the first anchor when that is the stop.
    assert Span(2, 8).needed_tokens(4) == 7 + 4
    assert Span(2, 8, stop=5).needed_tokens(4) == 4 + 4
    assert Span(2, 8, stop=2).needed_tokens(4) == 2 + 4
    assert Span(2, 8, stop=9).needed_tokens(4) == 7 + 4


def test_a_reference_of_exactly_the_needed_length_decides_every_round():
    drafts = {
        2: [[10], [20], [30]],  # commits 4 → anchor 6
        6: [[99], [40], [10]],  # commits 1 → anchor 7, the last anchor below the limit
        7: [[40], [10], [50]],  # all right: needs positions 8..10, the reference's 11 tokens
    }
    predictions = FixedPredictions(drafts, None)
    full = walk_prompt(predictions, TOKENS, SPAN, 4)
    exact = walk_prompt(predictions, TOKENS[:11], SPAN, 4)
    assert exact.reference_complete and exact.lengths == full.lengths == [4, 1, 4]
    # One token less: the last round cannot see its third slot, and says so.
    short = walk_prompt(predictions, TOKENS[:10], SPAN, 4)
    assert not short.reference_complete and short.lengths == [4, 1, 3]
    # With a stop token at 5, the last anchor a round can start at is 4: positions ≤ 7.
    stopped = Span(2, 8, stop=5)
    assert walk_prompt(predictions, TOKENS[:8], stopped, 4).reference_complete
    assert not walk_prompt(predictions, TOKENS[:7], stopped, 4).reference_complete


def test_a_short_reference_walks_to_its_last_known_token_and_no_further():
    misses = FixedPredictions({anchor: [[99], [99], [99]] for anchor in range(2, 12)}, None)
    walked = walk_prompt(misses, TOKENS[:6], SPAN, 4)
    # Anchors 2, 3 and 4 have a known next token; anchor 5, the last known token, has none,
    # so no round can be scored there (the limit, 8, is not reached).
    assert walked.lengths == [1, 1, 1]
    assert not walked.reference_complete


def test_a_stop_token_committed_as_a_round_s_bonus_token_ends_the_walk():
    drafts = {2: [[10], [20], [30]], 6: [[20], [40], [10]]}
    # The first round commits positions 3..6; its bonus token, at 6, is the stop token.
    walked = walk_prompt(FixedPredictions(drafts, None), TOKENS, Span(2, 8, stop=6), 4)
    assert walked.lengths == [4]
    assert walked.capped_lengths == [4]


# --- DDTree: budgets at a path node's pop index, the whole tree, float rounding -------------

# Prompt [1, 2], then 10, 21, 30 repeated: an anchor on 30 sees the continuation 10, 21, 30,
# the nodes (0,), (0, 1), (0, 1, 0) of the IDS/LOGPROBS tree, popped 0th, 4th and 5th; an
# anchor on 10 or 21 sees a first token outside slot 1's candidates (depth 0).
REPEATED = [1, 2, *[10, 21, 30] * 4]


def test_ddtree_walk_at_the_budgets_where_the_path_grows():
    walked = walk_prompt(FixedPredictions(IDS, LOGPROBS), REPEATED, SPAN, 4, [4, 5, 6])
    # Budget 4 holds pops 0..3: only (0,) of the path. Anchors 2 (10), 3 (21) → 1 each;
    # 4 (30) → 2; 6 (21) → 1; 7 (30) → 2, past the limit.
    assert walked.ddtree_lengths[4] == [1, 1, 2, 1, 2]
    # Budget 5 adds pop 4, (0, 1): anchor 4 → 3, anchor 7 → 3.
    assert walked.ddtree_lengths[5] == [1, 1, 3, 3]
    # Budget 6 adds pop 5, (0, 1, 0): anchor 4 → 4, to anchor 8 = the limit.
    assert walked.ddtree_lengths[6] == [1, 1, 4]
    # The previous convention stops at position 7: the round at anchor 4 is capped to 3.
    assert walked.capped_ddtree_lengths[4] == [1, 1, 2, 1]
    assert walked.capped_ddtree_lengths[5] == [1, 1, 3]
    assert walked.capped_ddtree_lengths[6] == [1, 1, 3]


def test_a_one_slot_tree_smaller_than_the_budget_pops_every_candidate():
    # A predictor gives one slot when a tree of ≤ k nodes cannot reach slot 2 (walk/predict.py);
    # the budget may exceed the whole tree (here 3 nodes).
    order = ddtree_pop_order([[-0.5, -1.0, -2.0]], 8)
    assert order == {(0,): 0, (1,): 1, (2,): 2}
    assert ddtree_depths([[10, 11, 12]], [[-0.5, -1.0, -2.0]], [12, 20], [2, 3, 8]) == {
        2: 0,
        3: 1,
        8: 1,
    }


def test_ddtree_scores_are_the_floats_the_reference_s_sums_give():
    # In floats, (1,) scores -0.1 - (-0.1) + (-0.3) = -0.3 and (0, 0) scores
    # -0.1 + (-0.2) = -0.30000000000000004: the DDTree authors' heap pops (1,) first,
    # although over the reals the two tie and (0, 0), the smaller rank tuple, would win.
    # Starting the sums from any other value than slot 1's best log-prob rounds otherwise.
    table = [[-0.1, -0.3, -0.6], [-0.2, -0.4, -0.7]]
    order = ddtree_pop_order(table, 6)
    assert sorted(order, key=order.get) == [(0,), (1,), (0, 0), (0, 1), (1, 0), (2,)]


class CountingPredictions(FixedPredictions):
    """FixedPredictions that count how often each anchor is read."""

    def __init__(self, ids, logprobs):
        super().__init__(ids, logprobs)
        self.drafts: dict[int, int] = {}
        self.trees: dict[int, int] = {}

    def draft(self, anchor, size=None):
        self.drafts[anchor, size] = self.drafts.get((anchor, size), 0) + 1
        return super().draft(anchor, size)

    def tree(self, anchor, size=None):
        self.trees[anchor, size] = self.trees.get((anchor, size), 0) + 1
        return super().tree(anchor, size)


def test_each_anchor_is_read_once_for_both_conventions_and_every_budget():
    # A drafter pass (and a tree expansion) per anchor is the walk's cost: the vanilla and
    # capped walks share the drafts, and one tree of the largest budget serves every budget.
    predictions = CountingPredictions(IDS, LOGPROBS)
    walked = walk_prompt(predictions, REPEATED, SPAN, 4, [4, 5, 6])
    assert walked.capped_lengths and walked.capped_ddtree_lengths[6]
    # Whole blocks once per anchor; the current loop's shortened block at 6 (2 slots) once.
    read = [(2, None), (3, None), (4, None), (6, None), (6, 2), (7, None)]
    assert sorted(predictions.drafts, key=str) == sorted(read, key=str)
    assert set(predictions.drafts.values()) == {1}
    assert sorted(predictions.trees, key=str) == sorted(read, key=str)
    assert set(predictions.trees.values()) == {1}
