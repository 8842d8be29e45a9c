"""Prompts and reference completions (the target's own greedy tokens g).

Completions come from local greedy generation with the target (default) or from an SGLang
server's native `/generate` endpoint (greedy: temperature 0). Prompts are a built-in set of
coding and reasoning prompts or a JSONL file; the chat template is applied when the
tokenizer has one, with thinking disabled.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dflash_eval.errors import HarnessError

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


def redact_url(url: str) -> str:
    """`url` without what may be a secret: user/password and the query string."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    if parts.username or parts.password:
        host = f"***@{host}"
    return urlunsplit((parts.scheme, host, parts.path, "***" if parts.query else "", ""))


def read_url(value: str) -> str:
    """--sglang-url's value: the URL itself, or `@FILE` to read it from a file (so that a URL
    with credentials stays out of argv, `ps` and the run's recorded command)."""
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text().strip()
    except OSError as error:
        raise HarnessError(f"--sglang-url {value}: cannot read the URL file ({error}).") from None


class SGLangClient:
    """Greedy completions from SGLang's native `/generate` endpoint."""

    def __init__(self, url: str, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.shown = redact_url(self.url)  # for messages: never a password or token
        self.timeout_s = timeout_s

    def complete(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        import requests

        request = {
            "input_ids": prompt_ids,
            "sampling_params": {
                "temperature": 0.0,
                "max_new_tokens": max_new_tokens,
                "skip_special_tokens": False,
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
