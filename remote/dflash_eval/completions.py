"""Prompts and reference completions (the target's own greedy tokens g).

Completions come from local greedy generation with the target (default) or from an SGLang
server's native `/generate` endpoint (greedy: temperature 0). Prompts are a built-in set of
coding and reasoning prompts or a JSONL file; the chat template is applied when the
tokenizer has one, with thinking disabled.

The *reference* is the completion (max_new_tokens tokens, or through the first stop token)
followed by `extra` (= block size) more greedy tokens, past max_new_tokens and past the stop
token: z-lab's live loop verifies whole blocks, so its last round compares drafts with the
target's greedy tokens beyond the completion, and scoring that round offline needs them.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dflash_eval.errors import HarnessError
from dflash_eval.urls import redact_url

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
    id: str
    messages: tuple[tuple[str, str], ...]  # (role, content) pairs

    def as_dicts(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


def builtin_prompts() -> list[Prompt]:
    return [Prompt(f"builtin-{i}", (("user", text),)) for i, text in enumerate(BUILTIN_PROMPTS)]


def read_prompts_jsonl(path: Path) -> list[Prompt]:
    """One JSON object per line: {"prompt": str} or {"messages": [{"role", "content"}…]};
    an optional "id" names it."""
    prompts = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise HarnessError(f"Cannot read the prompts file {path}: {error}.") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if "messages" in record:
                messages = tuple((m["role"], m["content"]) for m in record["messages"])
            else:
                messages = (("user", record.get("prompt", record.get("text"))),)
            if any(not isinstance(content, str) for _, content in messages):
                raise KeyError("prompt")
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise HarnessError(
                f"{path}:{number} is not a prompt: expected a JSON object with a string "
                '"prompt" (or "text") or a "messages" list of {"role", "content"}.'
            ) from None
        prompts.append(Prompt(str(record.get("id", f"line-{number}")), messages))
    if not prompts:
        raise HarnessError(f"The prompts file {path} holds no prompts.")
    return prompts


def prompts_hash(prompts: list[Prompt]) -> str:
    canonical = json.dumps([[p.id, p.messages] for p in prompts], ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def encode_prompt(tokenizer: Any, prompt: Prompt) -> tuple[list[int], bool]:
    """Token ids of the prompt; True when the chat template was applied."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            prompt.as_dicts(),
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=False,
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"], True
    text = "\n\n".join(content for _, content in prompt.messages)
    return tokenizer(text)["input_ids"], False


def first_stop(tokens: list[int], stops: list[int]) -> int | None:
    """Index of the first stop token, if any."""
    return next((index for index, token in enumerate(tokens) if token in stops), None)


def reference_length(tokens: list[int], max_new_tokens: int, extra: int, stops: list[int]) -> int:
    """How many greedy tokens the reference keeps: the completion and `extra` more."""
    stop = first_stop(tokens, stops)
    completion = max_new_tokens if stop is None else min(max_new_tokens, stop + 1)
    return completion + extra


@torch.inference_mode()
def greedy_reference(
    model: Any, prompt_ids: list[int], max_new_tokens: int, extra: int, stops: list[int]
) -> list[int]:
    """The target's greedy reference, decoded locally with its KV cache.

    Not `generate()`: given no EOS ids it falls back to the model's generation_config
    ones and stops there, and the reference must go on `extra` tokens past a stop token.
    """
    tokens: list[int] = []
    wanted = max_new_tokens + extra
    cache_name = _cache_argument(model)
    step = {"input_ids": torch.tensor([prompt_ids]), cache_name: None}
    while len(tokens) < wanted:
        output = model(**step, use_cache=True, logits_to_keep=1)
        tokens.append(int(output.logits[0, -1].argmax()))
        if tokens[-1] in stops:  # only the first stop shortens it; later ones change nothing
            wanted = min(wanted, reference_length(tokens, max_new_tokens, extra, stops))
        step = {"input_ids": torch.tensor([tokens[-1:]]), cache_name: output[cache_name]}
    return tokens


def _cache_argument(model: Any) -> str:
    """The name of the KV-cache argument and output: recent transformers renamed
    `past_key_values` to `cache` (and warn on the old name)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class SGLangClient:
    """Greedy completions from SGLang's native `/generate` endpoint."""

    def __init__(self, url: str, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.shown = redact_url(self.url)  # for messages: never a password or token
        self.timeout_s = timeout_s

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
            response = requests.post(f"{self.url}/generate", json=request, timeout=self.timeout_s)
        except requests.RequestException as error:
            raise HarnessError(
                f"Cannot reach the SGLang server at {self.shown} ({type(error).__name__}). "
                "Start it on the eval host (python -m sglang.launch_server "
                "--model-path <target>), check --sglang-url, or omit --sglang-url to "
                "generate the reference completions locally with the target."
            ) from None
        if response.status_code != 200:
            raise HarnessError(
                f"SGLang at {self.shown}/generate answered HTTP {response.status_code}: "
                f"{response.text[:300]}. Check the server log; the request was greedy "
                "generation from input_ids."
            )
        try:
            body = response.json()
            output_ids = body["output_ids"]
        except (ValueError, KeyError, TypeError):
            raise HarnessError(
                f"SGLang at {self.shown}/generate did not return output_ids "
                f"(got {response.text[:200]!r}). This harness needs token ids, which SGLang's "
                "native /generate returns; check the URL points at SGLang, not an "
                "OpenAI-compatible proxy."
            ) from None
        if not all(isinstance(token, int) for token in output_ids):
            raise HarnessError(f"SGLang at {self.shown} returned non-integer output_ids.")
        return list(output_ids)
