"""Plain live decoding loops, written independently of the harness's offline walk.

They follow z-lab's `dflash_generate` and the DDTree authors' `ddtree_generate` (greedy,
T=0), in both versions of the loop:

- `LiveRun.old_loop`: the loop of z-lab's commit 7d2ea1e9828b (and of `ddtree_generate`): a
  round starts while the position is below prompt + max_new_tokens, the target verifies a
  whole block (or tree) and may accept past that limit, and the loop ends after the round
  that commits a stop token;
- `LiveRun.current_loop`: the loop of commit 07ebd93db9f4: rounds run while position + 1 <
  max_length, the last block is shortened to what is left, a round's count is capped at
  max_length − position − 1 and cut after the first stop token.

At T = 0 every round recomputes everything from scratch (no caches). The drafter is
`PlainDrafter` (live_drafter.py: the DFlash forward written out from the config dict and the
weights, with its mask built position by position from the rule as the reference states it)
or `PlainDFlash2` (live_dflash2.py, the same for DFlash-2). Nothing is shared with the
harness. At T > 0 (`live_sampled_lengths`) the old loop decodes by rejection sampling, as
z-lab's `dflash_generate` at commit 10129599 does (`_sampling_probs`, `_rejection_sample`),
and, as there, a round's context features come from the previous round's verify pass (one
target forward per round, without a KV cache).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .live_dflash2 import PlainDFlash2
from .live_drafter import PlainDrafter


@dataclass
class LiveModels:
    target: torch.nn.Module  # a transformers causal LM
    drafter: PlainDrafter  # or a PlainDFlash2, whose draft is its selector's
    embed: torch.Tensor  # [V, H] the target's embedding
    head: torch.Tensor  # [V, H] the target's LM head


@torch.no_grad()
def target_next(models: LiveModels, tokens: list[int]) -> int:
    return int(models.target(torch.tensor([tokens])).logits[0, -1].argmax())


@torch.no_grad()
def target_pass(models: LiveModels, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [n, V], the drafter's context features [n, K·H]) of one target forward."""
    output = models.target(torch.tensor([tokens]), output_hidden_states=True)
    states = output.hidden_states
    features = torch.cat([states[i + 1][0] for i in models.drafter.target_layer_ids], dim=-1)
    return output.logits[0], features


def context_features(models: LiveModels, tokens: list[int], anchor: int) -> torch.Tensor:
    """[anchor, K·H] the target's hidden states at the drafter's layers, positions < anchor."""
    return target_pass(models, tokens[:anchor])[1]


@torch.no_grad()
def block_logits(
    models: LiveModels, features: torch.Tensor, first: int, size: int | None = None
) -> torch.Tensor:
    """[size-1, V] drafter logits for a block of `size` (default B) slots, [first, MASK…],
    over the context `features`."""
    drafter = models.drafter
    block_ids = [first] + [drafter.mask_token_id] * ((size or drafter.block_size) - 1)
    return drafter.logits(features, block_ids, models.embed, models.head)


def draft_logits(
    models: LiveModels, tokens: list[int], anchor: int, size: int | None = None
) -> torch.Tensor:
    """[size-1, V] drafter logits for the block of `size` (default B) slots anchored at
    `anchor` (context < anchor)."""
    return block_logits(models, context_features(models, tokens, anchor), tokens[anchor], size)


def vanilla_round(
    models: LiveModels, tokens: list[int], anchor: int, size: int | None = None
) -> list[int]:
    """Draft a block, let the target verify all of it: the tokens the round commits."""
    if isinstance(models.drafter, PlainDFlash2):
        features = context_features(models, tokens, anchor)
        size = size or models.drafter.block_size
        _, draft = models.drafter.draft(features, tokens[anchor], models.embed, models.head, size)
    else:
        draft = draft_logits(models, tokens, anchor, size).argmax(-1).tolist()
    with torch.no_grad():
        logits = models.target(torch.tensor([tokens[: anchor + 1] + draft])).logits[0]
    verified = logits[anchor:].argmax(-1).tolist()  # the target's token after each position
    accepted = 0
    while accepted < len(draft) and draft[accepted] == verified[accepted]:
        accepted += 1
    return [*draft[:accepted], verified[accepted]]


def build_tree(logprobs: torch.Tensor, budget: int) -> list[tuple[int, ...]]:
    """The DDTree authors' best-first tree: `budget` nodes as rank tuples, in pop order.

    logprobs: [B-1, V]. Candidates per slot: the top min(budget, V); heap entries compare
    (-score, ranks), so exact ties pop the lexicographically smaller rank tuple; a sibling's
    score is the node's minus its log-prob plus the sibling's.
    """
    width = min(budget, logprobs.shape[-1])
    top = torch.topk(logprobs.float(), width, dim=-1).values.tolist()
    popped: list[tuple[int, ...]] = []
    heap = [(-top[0][0], (0,), top[0][0])]
    while heap and len(popped) < budget:
        _, ranks, score = heapq.heappop(heap)
        popped.append(ranks)
        depth, rank = len(ranks), ranks[-1]
        if rank + 1 < width:
            sibling = score - top[depth - 1][rank] + top[depth - 1][rank + 1]
            heapq.heappush(heap, (-sibling, (*ranks[:-1], rank + 1), sibling))
        if depth < len(top):
            child = score + top[depth][0]
            heapq.heappush(heap, (-child, (*ranks, 0), child))
    return popped


def tree_round(
    models: LiveModels, tokens: list[int], anchor: int, budget: int, size: int | None = None
) -> list[int]:
    """Draft a tree, then follow the target's greedy tokens down it from the anchor."""
    logprobs = torch.log_softmax(draft_logits(models, tokens, anchor, size).float(), dim=-1)
    ids = torch.topk(logprobs, min(budget, logprobs.shape[-1]), dim=-1).indices.tolist()
    tree = build_tree(logprobs, budget)
    nodes = {tuple(ids[slot][rank] for slot, rank in enumerate(ranks)) for ranks in tree}
    path: tuple[int, ...] = ()
    sequence = tokens[: anchor + 1]
    while True:
        token = target_next(models, sequence)
        sequence.append(token)
        path = (*path, token)
        if path not in nodes:
            return list(path)  # the accepted path and the target's bonus token


@dataclass
class LiveRun:
    """One prompt decoded live, vanilla or (with a budget) DDTree."""

    models: LiveModels
    prompt_ids: list[int]
    max_new_tokens: int
    stops: list[int]
    budget: int | None = None

    def _round(self, tokens: list[int], position: int, size: int | None = None) -> list[int]:
        if self.budget is None:
            return vanilla_round(self.models, tokens, position, size)
        return tree_round(self.models, tokens, position, self.budget, size)

    def old_loop(self) -> tuple[list[int], list[int]]:
        """(committed tokens after the prompt, acceptance length per round) of the 7d2ea1e
        loop: no round is capped at the tokens left."""
        first = target_next(self.models, self.prompt_ids)
        return decode(self.prompt_ids, first, self.max_new_tokens, self.stops, self._round)

    def current_loop(self) -> tuple[list[int], list[int]]:
        """(committed tokens after the prompt, count per round) of the 07ebd93 loop (for
        DDTree, the same end rules)."""
        prompt_ids, models = self.prompt_ids, self.models
        tokens = [*prompt_ids, target_next(models, prompt_ids)]
        position, max_length = len(prompt_ids), len(prompt_ids) + self.max_new_tokens
        lengths: list[int] = []
        stopped = tokens[-1] in self.stops
        while position + 1 < max_length and not stopped:
            size = min(models.drafter.block_size, max_length - position)
            committed = self._round(tokens, position, size)
            produced = min(len(committed), max_length - position - 1)
            for index, token in enumerate(committed[:produced]):
                if token in self.stops:
                    produced, stopped = index + 1, True
                    break
            tokens = tokens[: position + 1] + committed[:produced]
            position += produced
            lengths.append(produced)
        return tokens[len(prompt_ids) :], lengths


def decode(
    prompt_ids: list[int],
    first: int,
    max_new_tokens: int,
    stops: list[int],
    round_at: Callable[[list[int], int], list[int]],
) -> tuple[list[int], list[int]]:
    """The loop itself: after the prompt's first token, rounds while the position is below
    prompt + max_new_tokens, ending after the round that commits a stop token."""
    tokens = [*prompt_ids, first]
    position, limit = len(prompt_ids), len(prompt_ids) + max_new_tokens
    lengths = []
    while position < limit:
        committed = round_at(tokens, position)
        tokens = tokens[: position + 1] + committed
        position += len(committed)
        lengths.append(len(committed))
        if any(token in stops for token in tokens[len(prompt_ids) :]):
            break
    return tokens[len(prompt_ids) :], lengths


# --- T > 0: rejection sampling, as z-lab's dflash_generate (commit 10129599) decodes --------


@dataclass(frozen=True)
class Settings:
    temperature: float
    top_p: float = 1.0
    top_k: int = 0


def plain_probs(logits: torch.Tensor, settings: Settings) -> torch.Tensor:
    """[..., V] → probabilities after temperature, top-k, then top-p, written plainly: the
    full softmax, zeroed outside the k best and renormalised (the same as a softmax over the
    k best scores), then zeroed where the mass of the likelier tokens already reaches p."""
    probs = torch.softmax(logits.float() / settings.temperature, dim=-1)
    if 0 < settings.top_k < probs.shape[-1]:
        kth = torch.topk(probs, settings.top_k, dim=-1).values[..., -1:]
        probs = torch.where(probs >= kth, probs, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if settings.top_p < 1:
        ordered, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(ordered, dim=-1) - ordered
        ordered = torch.where(before < settings.top_p, ordered, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, ordered)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def draw(probs: torch.Tensor, rng: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=rng))


def sampled_round(
    models: LiveModels,
    tokens: list[int],
    anchor: int,
    features: torch.Tensor,
    settings: Settings,
    rng: torch.Generator,
) -> tuple[list[int], torch.Tensor]:
    """One round: every slot drafted from q at once; the target accepts slot k with
    probability min(1, p/q) in order; at the first rejection a token from max(p − q, 0)
    normalised (p itself when that is all zero); after a full block a bonus token from p.

    `features`: the context before the anchor. As in z-lab's loop, the next round's context
    comes from this round's verify pass (a causal forward: its first positions are the
    committed tokens); returned cut to the positions before the next anchor."""
    q = plain_probs(block_logits(models, features[:anchor], tokens[anchor]), settings)  # [B-1, V]
    drafts = [draw(row, rng) for row in q]
    logits, verified = target_pass(models, tokens[: anchor + 1] + drafts)
    p = plain_probs(logits[anchor:], settings)  # [B, V]: the target's token after each
    for slot, token in enumerate(drafts):
        if float(torch.rand(1, generator=rng)) * q[slot, token] < p[slot, token]:
            continue
        residual = (p[slot] - q[slot]).clamp(min=0)
        residual = residual / residual.sum() if residual.sum() > 0 else p[slot]
        committed = [*drafts[:slot], draw(residual, rng)]
        break
    else:
        committed = [*drafts, draw(p[len(drafts)], rng)]
    return committed, verified[: anchor + len(committed)]


def live_sampled_lengths(
    models: LiveModels,
    prompt_ids: list[int],
    max_new_tokens: int,
    stops: list[int],
    settings: Settings,
    seed: int,
) -> tuple[list[int], list[int]]:
    """live_lengths at T > 0: the first token sampled from the target after the prompt, then
    rounds while the position is below prompt + max_new_tokens, uncapped, ending after the
    round that commits a stop token."""
    rng = torch.Generator().manual_seed(seed)
    logits, features = target_pass(models, prompt_ids)
    context = [features]  # the context before the next round's anchor

    def round_at(tokens: list[int], anchor: int) -> list[int]:
        committed, context[0] = sampled_round(models, tokens, anchor, context[0], settings, rng)
        return committed

    first = draw(plain_probs(logits[-1], settings), rng)
    return decode(prompt_ids, first, max_new_tokens, stops, round_at)
