"""Reference completions (the target's own greedy tokens g; at T > 0 its sampled tokens,
seeded per prompt: walk/sampling.py) of the prompts (contract/prompts.py).

Completions come from local greedy generation with the target (default) or from an SGLang
server's native `/generate` endpoint (greedy: temperature 0). The chat template is applied
when the tokenizer has one, with thinking off unless asked for.

The *reference* is the completion (max_new_tokens tokens, or through the first stop token)
followed by `extra` (= block size) more greedy tokens, past max_new_tokens and past the stop
token: z-lab's live loop verifies whole blocks, so its last round compares drafts with the
target's greedy tokens beyond the completion, and scoring that round offline needs them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.urls import conceal, endpoint, redact_url
from dflash_eval.reference.sequence import first_stop
from dflash_eval.reference.sglang_server import ServedModel, check_serves
from dflash_eval.walk.sampling import generator, sample_row, stream_seed
from dflash_eval.walk.sampling_settings import Sampling


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
    path: int = 0,
) -> tuple[list[int], list[float]]:
    """The prompt's sampled reference number `path` (T > 0), seeded per prompt and path, and
    each token's processed probability p (what the acceptance ratios divide by)."""
    rng = generator(stream_seed(sampling.seed, "completion", prompt_ids, path))
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
        return list(self.generate(prompt_ids, max_new_tokens, ignore_eos)["output_ids"])

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = False
    ) -> dict[str, Any]:
        """SGLang's whole answer to a greedy request (output_ids checked; meta_info as sent)."""
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
        return body


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
