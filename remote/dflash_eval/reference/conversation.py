"""Prompt token ids, turn by turn: what the target is asked at each turn of a conversation.

A single-turn prompt is its messages under the chat template. A later turn (MT-Bench's
second question) is asked after the first one *and the target's own reply to it*, as z-lab's
benchmark does: the reply is the target's completion of the previous turn, cut at
max_new_tokens, decoded without special tokens, and put back as the assistant's message. So
a later turn can only be encoded once the previous turn's completion exists; the harness
computes completions in order and tells this object each one (`replied`). At T > 0 each of a
prompt's sampled paths has its own history: path j of a later turn follows path j's reply.
"""

from __future__ import annotations

from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.prompts import Prompt

Messages = tuple[tuple[str, str], ...]


def encode_prompt(tokenizer: Any, prompt: Prompt, thinking: bool = False) -> tuple[list[int], bool]:
    """Token ids of the prompt; True when the chat template was applied."""
    return encode_messages(tokenizer, prompt.messages, thinking)


def encode_messages(
    tokenizer: Any, messages: tuple[tuple[str, str], ...], thinking: bool = False
) -> tuple[list[int], bool]:
    """Token ids of a conversation, ready for the assistant's next reply; True when the chat
    template was applied (`enable_thinking` goes to templates that read it, as z-lab's
    benchmark passes it; others ignore it)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": role, "content": content} for role, content in messages],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=thinking,
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"], True
    text = "\n\n".join(content for _, content in messages)
    return tokenizer(text)["input_ids"], False


def template_reads_thinking(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template has a thinking switch (`enable_thinking`)."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "enable_thinking" in template


class Conversations:
    def __init__(self, tokenizer: Any, thinking: bool, reply_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.thinking = thinking
        self.reply_tokens = reply_tokens
        # (prompt id, path) → the messages it was encoded from; → its messages and the reply
        self._asked: dict[tuple[str, int], Messages] = {}
        self._history: dict[tuple[str, int], Messages] = {}
        self._first: dict[str, str] = {}  # prompt id → id of its conversation's first turn

    def encode(self, prompt: Prompt, path: int = 0) -> list[int]:
        """Token ids of the prompt; a later turn needs its previous turn's reply first."""
        earlier: Messages = ()
        if prompt.follows is not None:
            if (prompt.follows, path) not in self._history:
                raise HarnessError(
                    f"Prompt {prompt.id} follows {prompt.follows}, which has no reply yet: "
                    "the turns of a conversation must come in order in the prompts file."
                )
            earlier = self._history[prompt.follows, path]
        self._asked[prompt.id, path] = earlier + prompt.messages
        self._first[prompt.id] = self._first.get(prompt.follows or "", prompt.id)
        return encode_messages(self.tokenizer, self._asked[prompt.id, path], self.thinking)[0]

    def replied(self, prompt: Prompt, completion: list[int], path: int = 0) -> None:
        """Record the target's completion of `prompt`, for the turn that follows it."""
        reply = self.tokenizer.decode(completion[: self.reply_tokens], skip_special_tokens=True)
        self._history[prompt.id, path] = (*self._asked[prompt.id, path], ("assistant", reply))

    def first_turn(self, prompt: Prompt) -> str:
        """The id of the first turn of the prompt's conversation (its own for one turn)."""
        return self._first.get(prompt.id, prompt.id)
