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

Every round recomputes everything from scratch (no caches), and the drafter is `PlainDrafter`
below: the DFlash forward written out from the config dict and the weights, with its mask
built position by position from the rule as the reference states it. Nothing is shared with
the harness.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import torch


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, positions: list[int], theta: float) -> torch.Tensor:
    """Plain RoPE on x [T, heads, D]: pairs (i, i + D/2) turned by position · theta^(-2i/D)."""
    half = x.shape[-1] // 2
    frequencies = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angles = torch.tensor(positions, dtype=torch.float64)[:, None] * frequencies  # [T, D/2]
    cos, sin = angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


@dataclass
class PlainDrafter:
    """A DFlash drafter (plain RoPE only) from its config dict and weights, computed as
    z-lab's `dflash/model.py` at 07ebd93 does."""

    config: dict[str, Any]  # the drafter's config.json
    weights: dict[str, torch.Tensor]  # unprefixed parameter names

    def value(self, name: str, default: Any = None) -> Any:
        """dflash_config first, then the top level (the reference's `_draft_value`)."""
        return (self.config.get("dflash_config") or {}).get(name, self.config.get(name, default))

    @property
    def block_size(self) -> int:
        return int(self.value("block_size"))

    @property
    def mask_token_id(self) -> int:
        return int(self.value("mask_token_id"))

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.value("target_layer_ids"))

    def sees(self, layer: int, query: int, key: int) -> bool:
        """Whether a query at absolute position `query` attends to the key at `key`."""
        layer_types = self.config.get("layer_types") or []
        sliding = bool(layer_types) and layer_types[layer] == "sliding_attention"
        stated = self.config.get("is_causal")
        causal = sliding if stated is None else bool(stated)
        # Qwen3Config keeps the window only when use_sliding_window is on.
        window = (
            self.config.get("sliding_window") if self.config.get("use_sliding_window") else None
        )
        if not sliding:
            window = None
        if causal and key > query:
            return False
        if window is not None and query - key >= window:
            return False
        return not (window is not None and not causal and key - query >= window)

    @torch.no_grad()
    def logits(
        self, features: torch.Tensor, block_ids: list[int], embed: torch.Tensor, head: torch.Tensor
    ) -> torch.Tensor:
        """Target features of positions 0..s-1 [s, K·H] and a block [g[s], MASK…] → the
        drafted slots' logits [len(block)-1, V]."""
        w, c = self.weights, self.config
        eps = float(c.get("rms_norm_eps", 1e-6))
        theta = float(c.get("rope_theta") or (c.get("rope_parameters") or {})["rope_theta"])
        heads, kv_heads = int(c["num_attention_heads"]), int(c["num_key_value_heads"])
        d = int(c.get("head_dim") or c["hidden_size"] // heads)
        ctx = _rms(features @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
        start, size = ctx.shape[0], len(block_ids)
        x = embed[block_ids] * float(self.value("input_embedding_scale", 1.0))
        keys, queries = list(range(start + size)), list(range(start, start + size))
        for layer in range(int(c["num_hidden_layers"])):
            p = {
                n[len(f"layers.{layer}.") :]: t
                for n, t in w.items()
                if n.startswith(f"layers.{layer}.")
            }
            normed = _rms(x, p["input_layernorm.weight"], eps)
            both = torch.cat([ctx, normed])  # context first, then the block
            q = _rms(
                (normed @ p["self_attn.q_proj.weight"].T).view(size, heads, d),
                p["self_attn.q_norm.weight"],
                eps,
            )
            k = _rms(
                (both @ p["self_attn.k_proj.weight"].T).view(len(keys), kv_heads, d),
                p["self_attn.k_norm.weight"],
                eps,
            )
            v = (both @ p["self_attn.v_proj.weight"].T).view(len(keys), kv_heads, d)
            q, k = _rotate(q, queries, theta), _rotate(k, keys, theta)
            k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
            allowed = torch.tensor([[self.sees(layer, i, j) for j in keys] for i in queries])
            scores = scores.masked_fill(~allowed, float("-inf"))
            out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)
            x = x + out.reshape(size, heads * d) @ p["self_attn.o_proj.weight"].T
            normed = _rms(x, p["post_attention_layernorm.weight"], eps)
            gate, up = normed @ p["mlp.gate_proj.weight"].T, normed @ p["mlp.up_proj.weight"].T
            x = x + (gate * torch.sigmoid(gate) * up) @ p["mlp.down_proj.weight"].T
        logits = _rms(x, w["norm.weight"], eps)[1:] @ head.T
        logits = logits * float(self.value("output_multiplier", 1.0))
        cap = self.value("final_logit_softcapping")
        if cap is not None and float(cap) > 0:
            logits = torch.tanh(logits / float(cap)) * float(cap)
        return logits


@dataclass
class LiveModels:
    target: torch.nn.Module  # a transformers causal LM
    drafter: PlainDrafter
    embed: torch.Tensor  # [V, H] the target's embedding
    head: torch.Tensor  # [V, H] the target's LM head


@torch.no_grad()
def target_next(models: LiveModels, tokens: list[int]) -> int:
    return int(models.target(torch.tensor([tokens])).logits[0, -1].argmax())


@torch.no_grad()
def draft_logits(
    models: LiveModels, tokens: list[int], anchor: int, size: int | None = None
) -> torch.Tensor:
    """[size-1, V] drafter logits for the block of `size` (default B) slots anchored at
    `anchor` (context < anchor)."""
    drafter = models.drafter
    hidden = models.target(torch.tensor([tokens[:anchor]]), output_hidden_states=True)
    states = hidden.hidden_states
    features = torch.cat([states[i + 1][0] for i in drafter.target_layer_ids], dim=-1)
    size = size or drafter.block_size
    block_ids = [tokens[anchor]] + [drafter.mask_token_id] * (size - 1)
    return drafter.logits(features, block_ids, models.embed, models.head)


def vanilla_round(
    models: LiveModels, tokens: list[int], anchor: int, size: int | None = None
) -> list[int]:
    """Draft a block, let the target verify all of it: the tokens the round commits."""
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
        prompt_ids, models = self.prompt_ids, self.models
        tokens = [*prompt_ids, target_next(models, prompt_ids)]
        position, limit = len(prompt_ids), len(prompt_ids) + self.max_new_tokens
        lengths = []
        while position < limit:
            committed = self._round(tokens, position)
            tokens = tokens[: position + 1] + committed
            position += len(committed)
            lengths.append(len(committed))
            if any(token in self.stops for token in tokens[len(prompt_ids) :]):
                break
        return tokens[len(prompt_ids) :], lengths

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
