"""One sequence of a run: a prompt (one turn, one sampled path), its reference completion and
where the rounds run in it, and, once computed, the target's features over it. No torch: a dry
run counts its cache entries with these (plan/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dflash_eval.contract.prompts import Prompt
from dflash_eval.walk.metrics import Span

if TYPE_CHECKING:
    import torch


@dataclass
class Sequence:
    """One prompt with its reference (the completion and the tokens past its end), where
    its rounds run, and (after the hidden-state phase) its target features."""

    prompt: Prompt
    prompt_ids: list[int]
    path: int = 0  # T > 0: which of the prompt's sampled completions
    reference: list[int] = field(default_factory=list)
    span: Span | None = None
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    target_probs: list[float] = field(default_factory=list)  # T > 0: p of each reference token
    completion_hit: bool = False
    hidden_hit: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.reference

    def take_reference(self, reference: list[int], max_new_tokens: int, stops: list[int]) -> None:
        """Keep the reference and where the rounds run: from the prompt's end up to
        max_new_tokens, ending early at the first stop token."""
        self.reference = reference
        first, stop = len(self.prompt_ids), first_stop(reference, stops)
        self.span = Span(first, first + max_new_tokens, None if stop is None else first + stop)

    @property
    def completion(self) -> list[int]:
        """What the live loop outputs: max_new_tokens tokens, or through the stop token."""
        assert self.span is not None, "the completion is known once the reference is"
        return self.tokens[self.span.first_anchor : self.span.end]


def first_stop(tokens: list[int], stops: list[int]) -> int | None:
    """Index of the first stop token, if any."""
    return next((index for index, token in enumerate(tokens) if token in stops), None)
