"""Plain live decoding loops, written independently of the harness's offline walk.

They follow z-lab's `dflash_generate` and the DDTree authors' `ddtree_generate` (greedy,
T=0): a round starts while the position is below prompt + max_new_tokens, the target
verifies a whole block (or tree) and may accept past that limit, and the loop ends after
the round that commits a stop token. Every round recomputes everything from scratch (no
caches), so that nothing is shared with the harness but the drafter's forward; a DFlash-2
drafter (live_dflash2.py) shares nothing with the harness at all.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from .live_dflash2 import PlainDFlash2


@dataclass
class LiveModels:
    target: torch.nn.Module  # a transformers causal LM
    drafter: torch.nn.Module | PlainDFlash2  # dflash_eval.model.DFlashDrafter, or DFlash-2
    embed: torch.Tensor  # [V, H] the target's embedding
    head: torch.Tensor  # [V, H] the target's LM head


@torch.no_grad()
def target_next(models: LiveModels, tokens: list[int]) -> int:
    return int(models.target(torch.tensor([tokens])).logits[0, -1].argmax())


@torch.no_grad()
def context_features(models: LiveModels, tokens: list[int], anchor: int) -> torch.Tensor:
    """[anchor, K·H] the target's hidden states at the drafter's layers, positions < anchor."""
    hidden = models.target(torch.tensor([tokens[:anchor]]), output_hidden_states=True)
    states = hidden.hidden_states
    return torch.cat([states[i + 1][0] for i in models.drafter.config.target_layer_ids], dim=-1)


@torch.no_grad()
def draft_logits(models: LiveModels, tokens: list[int], anchor: int) -> torch.Tensor:
    """[B-1, V] drafter logits for the block anchored at `anchor` (context < anchor)."""
    config = models.drafter.config
    features = context_features(models, tokens, anchor)
    block_ids = [tokens[anchor]] + [config.mask_token_id] * (config.block_size - 1)
    context = models.drafter.fuse_context(features)
    return models.drafter.forward_uncached(context, models.embed[block_ids])[1:] @ models.head.T


def vanilla_round(models: LiveModels, tokens: list[int], anchor: int) -> list[int]:
    """Draft a block, let the target verify all of it: the tokens the round commits."""
    if isinstance(models.drafter, PlainDFlash2):
        features = context_features(models, tokens, anchor)
        _, draft = models.drafter.draft(features, tokens[anchor], models.embed, models.head)
    else:
        draft = draft_logits(models, tokens, anchor).argmax(-1).tolist()
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


def tree_round(models: LiveModels, tokens: list[int], anchor: int, budget: int) -> list[int]:
    """Draft a tree, then follow the target's greedy tokens down it from the anchor."""
    logprobs = torch.log_softmax(draft_logits(models, tokens, anchor).float(), dim=-1)
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


def live_lengths(
    models: LiveModels,
    prompt_ids: list[int],
    max_new_tokens: int,
    stops: list[int],
    budget: int | None = None,
) -> tuple[list[int], list[int]]:
    """(committed tokens after the prompt, acceptance length per round), vanilla or, with a
    budget, DDTree. Like the reference loops: no round is capped at the tokens left."""
    tokens = [*prompt_ids, target_next(models, prompt_ids)]
    position, limit = len(prompt_ids), len(prompt_ids) + max_new_tokens
    lengths = []
    while position < limit:
        if budget is None:
            committed = vanilla_round(models, tokens, position)
        else:
            committed = tree_round(models, tokens, position, budget)
        tokens = tokens[: position + 1] + committed
        position += len(committed)
        lengths.append(len(committed))
        if any(token in stops for token in tokens[len(prompt_ids) :]):
            break
    return tokens[len(prompt_ids) :], lengths
