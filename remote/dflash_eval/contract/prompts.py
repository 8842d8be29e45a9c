"""The prompts a run evaluates: a built-in set of coding and reasoning prompts, or a JSONL
file (which may hold named sets built on the workstation, multi-turn ones included:
reference/conversation.py), and their hash.

Stdlib only: the workstation reads and hashes prompts as the harness does, to tell before a
run whether its numbers will be comparable with those already pulled.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.schema import PromptSet

BUILTIN_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number using memoisation, "
    "and explain its time complexity.",
    "Implement binary search over a sorted list in Python. Return the index of the target "
    "or -1 when it is absent.",
    "A train leaves at 9:40 and arrives at 13:15. How long is the journey in minutes? "
    "Show your reasoning step by step.",
    "Write a SQL query that returns the five customers with the highest total order value "
    "from tables customers(id, name) and orders(id, customer_id, amount).",
    "Explain the difference between a process and a thread, with one example where each "
    "is the better choice.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did she sell altogether in April and May?",
    "Write a bash one-liner that counts the lines of every *.py file under the current "
    "directory and prints the total.",
    "Prove that the sum of two even integers is even.",
    "Write a JavaScript function that debounces another function by a given number of "
    "milliseconds.",
    "Refactor this code to be more readable and explain each change:\n"
    "def f(l):\n    r=[]\n    for i in l:\n        if i%2==0: r.append(i*i)\n    return r",
)


@dataclass(frozen=True)
class Prompt:
    """One prompt. A later turn of a conversation `follows` the turn before it: its prompt is
    that turn's conversation, the target's reply to it, then its own `messages`."""

    id: str
    messages: tuple[tuple[str, str], ...]  # (role, content) pairs
    dataset: str | None = None  # the named set it came from
    follows: str | None = None  # id of the previous turn of its conversation
    source: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    def as_dicts(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


def builtin_prompts() -> list[Prompt]:
    return [Prompt(f"builtin-{i}", (("user", text),)) for i, text in enumerate(BUILTIN_PROMPTS)]


def read_prompts_jsonl(path: Path) -> list[Prompt]:
    """One JSON object per line: {"prompt": str}, {"messages": [{"role", "content"}…]} or
    {"turns": [str, …]} (a multi-turn conversation: one prompt per user turn, each after
    the target's replies to the ones before); optional "id", "dataset" (the named set it
    belongs to) and "source" (where that set came from, recorded in the results)."""
    prompts = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise HarnessError(f"Cannot read the prompts file {path}: {error}.") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            prompts += _record_prompts(json.loads(line), f"line-{number}")
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError):
            raise HarnessError(
                f"{path}:{number} is not a prompt: expected a JSON object with a string "
                '"prompt" (or "text"), a "messages" list of {"role", "content"} or a '
                '"turns" list of strings.'
            ) from None
    if not prompts:
        raise HarnessError(f"The prompts file {path} holds no prompts.")
    return prompts


def _record_prompts(record: dict[str, Any], default_id: str) -> list[Prompt]:
    """The prompt(s) of one JSONL record: one per user turn."""
    identity = str(record.get("id", default_id))
    dataset, source = record.get("dataset"), record.get("source")
    if dataset is not None and not isinstance(dataset, str):
        raise TypeError("dataset")
    if "turns" in record:
        turns = [(("user", turn),) for turn in record["turns"]]
        if not turns:
            raise ValueError("no turns")
    elif "messages" in record:
        turns = [tuple((m["role"], m["content"]) for m in record["messages"])]
    else:
        turns = [(("user", record.get("prompt", record.get("text"))),)]
    if any(not isinstance(content, str) for messages in turns for _, content in messages):
        raise TypeError("prompt")
    if len(turns) == 1:
        return [Prompt(identity, turns[0], dataset, source=source)]
    ids = [f"{identity}#turn-{n}" for n in range(1, len(turns) + 1)]
    return [
        Prompt(ids[n], messages, dataset, ids[n - 1] if n else None, source)
        for n, messages in enumerate(turns)
    ]


def prompts_hash(prompts: list[Prompt]) -> str:
    """sha256 of the prompts in order: id and messages, and the set and the turn each
    follows when given (so plain prompts hash as they always did)."""
    canonical = json.dumps(
        [
            [p.id, p.messages]
            + ([{"dataset": p.dataset, "follows": p.follows}] if p.dataset or p.follows else [])
            for p in prompts
        ],
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def prompt_sets(prompts: list[Prompt]) -> dict[str, PromptSet]:
    """Per named set: how many prompts (turns), their hash, and where the set came from
    (the first record's "source"; the workstation writes the same one on each)."""
    names = dict.fromkeys(p.dataset for p in prompts if p.dataset)
    sets = {}
    for name in names:
        members = [p for p in prompts if p.dataset == name]
        sets[name] = PromptSet(
            count=len(members), sha256=prompts_hash(members), source=members[0].source
        )
    return sets
