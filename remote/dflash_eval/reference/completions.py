"""Prompts and reference completions (the target's own greedy tokens g; at T > 0 its
sampled tokens, seeded per prompt: walk/sampling.py).

Completions come from local greedy generation with the target (default) or from an SGLang
server's native `/generate` endpoint (greedy: temperature 0). Prompts are a built-in set of
coding and reasoning prompts or a JSONL file (which may hold named sets built on the
workstation, multi-turn ones included: conversation.py); the chat template is applied when
the tokenizer has one, with thinking off unless asked for.

The *reference* is the completion (max_new_tokens tokens, or through the first stop token)
followed by `extra` (= block size) more greedy tokens, past max_new_tokens and past the stop
token: z-lab's live loop verifies whole blocks, so its last round compares drafts with the
target's greedy tokens beyond the completion, and scoring that round offline needs them.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.schema import PromptSet
from dflash_eval.contract.urls import conceal, endpoint, redact_url
from dflash_eval.reference.sglang_server import ServedModel, check_serves
from dflash_eval.walk.sampling import Sampling, generator, sample_row, stream_seed

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


def first_stop(tokens: list[int], stops: list[int]) -> int | None:
    """Index of the first stop token, if any."""
    return next((index for index, token in enumerate(tokens) if token in stops), None)


def reference_length(tokens: list[int], max_new_tokens: int, extra: int, stops: list[int]) -> int:
    """How many greedy tokens the reference keeps: the completion and `extra` more."""
    stop = first_stop(tokens, stops)
    completion = max_new_tokens if stop is None else min(max_new_tokens, stop + 1)
    return completion + extra


def greedy_reference(
    model: Any, prompt_ids: list[int], max_new_tokens: int, extra: int, stops: list[int]
) -> list[int]:
    """The target's greedy reference, decoded locally with its KV cache.

    Not `generate()`: given no EOS ids it falls back to the model's generation_config
    ones and stops there, and the reference must go on `extra` tokens past a stop token.
    """
    return decode_reference(model, prompt_ids, max_new_tokens, extra, stops, _greedy)[0]


def sampled_reference(
    model: Any,
    prompt_ids: list[int],
    max_new_tokens: int,
    extra: int,
    stops: list[int],
    sampling: Sampling,
) -> tuple[list[int], list[float]]:
    """The target's sampled reference (T > 0), seeded per prompt, and each token's processed
    probability p (what the acceptance ratios divide by)."""
    rng = generator(stream_seed(sampling.seed, "completion", prompt_ids))
    return decode_reference(
        model,
        prompt_ids,
        max_new_tokens,
        extra,
        stops,
        lambda logits: sample_row(logits, sampling, rng),
    )


def _greedy(logits: torch.Tensor) -> tuple[int, float]:
    return int(logits.argmax()), 1.0


@torch.inference_mode()
def decode_reference(
    model: Any,
    prompt_ids: list[int],
    max_new_tokens: int,
    extra: int,
    stops: list[int],
    choose: Callable[[torch.Tensor], tuple[int, float]],
) -> tuple[list[int], list[float]]:
    """(tokens, probability of each) of a reference: `choose` picks each token from the
    last position's logits."""
    tokens: list[int] = []
    probs: list[float] = []
    wanted = max_new_tokens + extra
    cache_name = _cache_argument(model)
    device = next(model.parameters()).device
    step = {"input_ids": torch.tensor([prompt_ids], device=device), cache_name: None}
    while len(tokens) < wanted:
        output = model(**step, use_cache=True, logits_to_keep=1)
        token, prob = choose(output.logits[0, -1].cpu())
        tokens.append(token)
        probs.append(prob)
        if tokens[-1] in stops:  # only the first stop shortens it; later ones change nothing
            wanted = min(wanted, reference_length(tokens, max_new_tokens, extra, stops))
        step = {
            "input_ids": torch.tensor([tokens[-1:]], device=device),
            cache_name: output[cache_name],
        }
    return tokens, probs


def _cache_argument(model: Any) -> str:
    """The name of the KV-cache argument and output: recent transformers renamed
    `past_key_values` to `cache` (and warn on the old name)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class SGLangClient:
    """Greedy completions from SGLang's native `/generate` endpoint."""

    def __init__(self, url: str, timeout_s: float = 600.0) -> None:
        self.url = url.strip()
        self.generate_url = endpoint(self.url, "generate")
        self.shown = redact_url(self.url)  # for messages: scheme, host and port only
        self.timeout_s = timeout_s
        self.served: ServedModel | None = None  # what the server said it serves

    def reference(
        self, prompt_ids: list[int], max_new_tokens: int, extra: int, stops: list[int]
    ) -> list[int]:
        """The greedy reference (module docstring). The server is asked to ignore EOS, so
        that it goes on past a stop token; the tokens beyond the reference are dropped."""
        generated = self.complete(prompt_ids, max_new_tokens + extra, ignore_eos=True)
        return generated[: reference_length(generated, max_new_tokens, extra, stops)]

    def complete(
        self, prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = False
    ) -> list[int]:
        import requests

        request = {
            "input_ids": prompt_ids,
            "sampling_params": {
                "temperature": 0.0,
                "max_new_tokens": max_new_tokens,
                "skip_special_tokens": False,
                "ignore_eos": ignore_eos,
            },
        }
        try:
            response = requests.post(self.generate_url, json=request, timeout=self.timeout_s)
        except requests.RequestException as error:
            raise HarnessError(
                f"Cannot reach the SGLang server at {self.shown} ({type(error).__name__}). "
                "Start it on the eval host (python -m sglang.launch_server "
                "--model-path <target>), check --sglang-url, or omit --sglang-url to "
                "generate the reference completions locally with the target."
            ) from None
        if response.status_code != 200:
            raise HarnessError(
                f"SGLang's /generate at {self.shown} answered HTTP {response.status_code}: "
                f"{conceal(response.text[:300], self.url)}. Check the server log; the request "
                "was greedy "
                "generation from input_ids."
            )
        try:
            body = response.json()
            output_ids = body["output_ids"]
        except (ValueError, KeyError, TypeError):
            raise HarnessError(
                f"SGLang's /generate at {self.shown} did not return output_ids "
                f"(got {conceal(response.text[:200], self.url)!r}). This harness needs token "
                "ids, which SGLang's "
                "native /generate returns; check the URL points at SGLang, not an "
                "OpenAI-compatible proxy."
            ) from None
        if not all(isinstance(token, int) for token in output_ids):
            raise HarnessError(f"SGLang at {self.shown} returned non-integer output_ids.")
        return list(output_ids)


def checked_client(url: str, target: Path, say: Callable[[str], None]) -> SGLangClient:
    """A client of the SGLang server at `url`, once the server has said that it serves
    `target` (dflash_eval.reference.sglang_server refuses another model)."""
    client = SGLangClient(url)
    client.served = check_serves(url, target)
    say(
        f"SGLang at {client.shown} serves {client.served.model_path} "
        f"(version {client.served.version or 'not given'})"
    )
    return client
