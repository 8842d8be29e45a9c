"""Numeric health: what would make the numbers meaningless without any error stops the run.

- drafter weights that are NaN or infinite (a diverged training step, a damaged file), in the
  dtype the drafter runs in (a float32 value past bfloat16's range becomes inf there);
- drafter logits that are NaN or infinite for some prompt (weights, target features or the
  borrowed head gone bad): an argmax over NaN still names a token, so τ would quietly be 1.

(A prompt that runs past the target's context is refused before anything runs: fit.py.)

Each check reads what the run computes anyway; the logits check is one reduction of the
per-slot normalisers, the weights check one pass over the drafter's tensors at load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dflash_eval.contract.errors import HarnessError


class NonFiniteWeights(HarnessError):
    """A drafter parameter holds NaN or inf: the checkpoint is refused, named as such."""


class NonFiniteLogits(HarnessError):
    """The drafter's logits hold NaN or inf; `_walk_all` names the prompt and the cause."""


def require_finite_weights(state_dict: dict[str, torch.Tensor], path: Path, dtype: str) -> None:
    """Stop at the first floating tensor with a NaN or inf, naming it and the count."""
    for name, tensor in state_dict.items():
        if not tensor.is_floating_point():
            continue
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            bad = tensor.numel() - int(finite.sum())
            raise NonFiniteWeights(
                f"Drafter weights in {path}: {name} {list(tensor.shape)} holds {bad} "
                f"non-finite value(s) (NaN or inf) in {dtype}. Its τ would mean nothing: the "
                "training step diverged or the file is damaged. Evaluate an earlier "
                "checkpoint (or re-stage this one with --verify)."
            )


def require_finite_logits(normaliser: torch.Tensor) -> None:
    """`normaliser`: each slot's logsumexp, NaN or inf as soon as one of its logits is."""
    if not bool(torch.isfinite(normaliser).all()):
        raise NonFiniteLogits("non-finite drafter logits")


def non_finite_logits(prompt_id: str, role: str, features: torch.Tensor, head: Any) -> HarnessError:
    """The error for a prompt whose drafter logits were not finite, with the likely cause."""
    if not bool(torch.isfinite(features).all()):
        cause = (
            "the target's hidden states for it hold NaN or inf: recompute them (delete the "
            "cache entry or re-extract the feature set)"
        )
    elif not (
        bool(torch.isfinite(head.embed_weight).all())
        and bool(torch.isfinite(head.head_weight).all())
    ):
        cause = "the target's embedding or LM head holds NaN or inf in the drafter's dtype"
    else:
        cause = (
            "its inputs are finite, so the drafter's own computation overflows: try --dtype float32"
        )
    return HarnessError(
        f"The {role.replace('_', ' ')}'s logits for prompt {prompt_id} hold NaN or inf; "
        f"{cause}. The run stops rather than count a meaningless acceptance."
    )
