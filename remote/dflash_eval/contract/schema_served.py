"""The served record: the acceptance length SGLang itself got with a drafter (`served-eval`),
as TypedDicts. Its own kind: a served τ is comparable only with served runs of the same
settings (served_key: target, block size, SGLang version, request settings), and with the CPU τ
of the same prompts in SGLang's count (docs/served.md). Stdlib only.

SGLang's count (sgl-project/sglang at 001067fffe33,
python/sglang/srt/managers/tokenizer_manager.py, TokenizerManager._calculate_spec_decoding_metrics):
a request's acceptance length is `completion_tokens / spec_verify_ct`, the completion tokens
including the one the prefill produced, the verification steps the rounds of z-lab's
current loop (the harness's `zlab-07ebd93` convention, `metrics.capped`).
"""

from __future__ import annotations

from typing import Any, TypedDict, cast

from dflash_eval.contract.schema_check import SchemaError, check

KIND = "dflash-served-results"
SCHEMA_VERSION = 1


class IntervalRecord(TypedDict):
    value: float
    low: float | None
    """Percentile bootstrap over conversations, as the CPU τ's `by_dataset`; null with one."""
    high: float | None


class ServedPrompt(TypedDict):
    id: str
    conversation: str
    """Id of its conversation's first turn (the bootstrap's unit)."""
    prompt_tokens: int
    completion_tokens: int
    """SGLang's `meta_info.completion_tokens`."""
    verify_steps: int
    """SGLang's `meta_info.spec_verify_ct` (0 when the first token ended the reply)."""
    tau: float | None
    """completion_tokens / verify_steps; null without a verification step."""


class ServedTau(TypedDict):
    tau_macro: IntervalRecord | None
    """Mean over prompts of each prompt's τ."""
    tau_pooled: IntervalRecord | None
    """Σ completion tokens / Σ verification steps."""
    completion_tokens: int
    verify_steps: int
    convention: str
    """`sglang: completion_tokens / spec_verify_ct`."""


class ServerRecord(TypedDict):
    algorithm: str
    """`DFLASH`."""
    num_draft_tokens: int
    """--speculative-num-draft-tokens: the drafter's block size."""
    drafter: str
    """The drafter directory the server loaded (fab export-drafter's)."""
    target: str
    version: str | None
    """What /get_server_info says."""
    gpus: str | None
    """CUDA_VISIBLE_DEVICES the server started with."""


class Settings(TypedDict):
    max_new_tokens: int
    thinking: bool
    temperature: float
    prompts_sha256: str
    prompts: int


class ServedResults(TypedDict):
    kind: str
    schema_version: int
    step: int | None
    server: ServerRecord
    settings: Settings
    served: ServedTau
    per_prompt: list[ServedPrompt]
    created_at: str


def parse_served(value: Any) -> ServedResults:
    """`value` as ServedResults, or SchemaError naming the first field missing or wrong."""
    if not isinstance(value, dict) or value.get("kind") != KIND:
        raise SchemaError(f"not a served record ('kind' is not {KIND!r})")
    if value.get("schema_version") != SCHEMA_VERSION:
        raise SchemaError(
            f"served record schema_version {value.get('schema_version')!r}, this dflash-ops "
            f"reads {SCHEMA_VERSION}"
        )
    check(value, ServedResults, "served")
    return cast(ServedResults, value)


def served_key(record: ServedResults) -> dict[str, Any]:
    """What two served records must share to be compared (their comparability key): the
    kind, the server's target, algorithm, block size and SGLang version (another version is
    another count), and every request setting. The drafter's directory is left out: each
    step's export is its own, and steps are what a served table compares."""
    server = record["server"]
    return {
        "kind": KIND,
        "target": server["target"],
        "algorithm": server["algorithm"],
        "num_draft_tokens": server["num_draft_tokens"],
        "version": server["version"],
        **record["settings"],
    }
