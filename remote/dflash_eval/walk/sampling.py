"""Sampling (T > 0): the probabilities both models sample from, and seeds.

The reference is z-lab's `dflash/model.py` at commit 10129599 (`_sampling_probs`,
`_rejection_sample`, `dflash_generate`). Both the target's and the drafter's logits go
through the same steps, in this order:

1. `logits.float() / temperature`;
2. top-k (0 < k < vocabulary): keep the k largest scores (`torch.topk`), softmax over them;
3. top-p (p < 1): sort the probabilities in descending order (`sort(descending=True)`),
   keep a token while the mass *before* it is below p (so the most likely token is always
   kept), renormalise;
4. scatter back to the vocabulary (zero elsewhere).

Exact ties are ordered as `torch.topk` and `torch.sort` order them, as in the reference.
Temperature 0 is greedy decoding, the harness's default and the T = 0 walk (metrics.py).

Every random draw is seeded: `stream_seed(seed, purpose, prompt_ids)` gives each prompt its
own stream, so a prompt's sampled completion does not depend on the other prompts or on
their order (and is cached under its key).
"""

from __future__ import annotations

import hashlib
import json

import torch

from dflash_eval.walk.sampling_settings import Sampling

# Rows of a [rows, V] probability computation at once: bounds the sort's memory.
ROWS_AT_ONCE = 256


def processed_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """[..., V] logits → [..., V] float32 probabilities after temperature, top-k, top-p."""
    scores = logits.float() / sampling.temperature
    vocab = scores.shape[-1]
    kept_ids = None
    if 0 < sampling.top_k < vocab:
        scores, kept_ids = torch.topk(scores, sampling.top_k, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sampling.top_p < 1:
        ordered, order = probs.sort(dim=-1, descending=True)
        # Exclusive prefix mass: the first token is kept whatever its own mass.
        ordered = ordered * (ordered.cumsum(dim=-1) - ordered < sampling.top_p)
        probs = torch.zeros_like(probs).scatter(-1, order, ordered)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if kept_ids is not None:
        probs = torch.zeros(logits.shape, dtype=probs.dtype).scatter(-1, kept_ids, probs)
    return probs


def token_probs(logits: torch.Tensor, tokens: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """[R, V] logits and [R] token ids → [R] processed probability of each row's token."""
    found = []
    for start in range(0, logits.shape[0], ROWS_AT_ONCE):
        rows = slice(start, start + ROWS_AT_ONCE)
        probs = processed_probs(logits[rows], sampling)
        found.append(probs.gather(-1, tokens[rows, None])[:, 0])
    return torch.cat(found) if found else torch.zeros(0)


def stream_seed(seed: int, purpose: str, prompt_ids: list[int], path: int = 0) -> int:
    """A 63-bit seed of its own for one prompt, one purpose ("completion", "walks") and one of
    its sampled paths (the first path's stream is the one of runs before --paths)."""
    text = json.dumps([seed, purpose if not path else f"{purpose} {path}", prompt_ids])
    return int(hashlib.sha256(text.encode()).hexdigest()[:16], 16) >> 1


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sample_row(logits: torch.Tensor, sampling: Sampling, rng: torch.Generator) -> tuple[int, float]:
    """One token drawn from a [V] logit row as the reference samples it, and its probability."""
    probs = processed_probs(logits, sampling)
    token = int(torch.multinomial(probs, 1, generator=rng))
    return token, float(probs[token])
