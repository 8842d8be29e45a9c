"""`served-eval`: the acceptance length a running SGLang server gets with its DFlash drafter.

The prompts are built exactly as `eval` builds them (the same prompts file and --num-prompts,
the target's chat template, the thinking flag, later turns after the earlier turn's reply)
and sent to SGLang's native `/generate` greedily (T = 0) with `max_new_tokens`. Each
request's served τ is SGLang's own count, `meta_info.completion_tokens /
meta_info.spec_verify_ct` (schema_served.py names the SGLang source followed); macro and
pooled over the prompts, with the percentile bootstrap over conversations the CPU τ uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_eval.contract.bootstrap import Bootstrap
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.progress import Progress
from dflash_eval.contract.prompts import Prompt, prompts_hash
from dflash_eval.contract.schema_served import (
    KIND,
    SCHEMA_VERSION,
    ServedPrompt,
    ServedResults,
    ServedTau,
)
from dflash_eval.reference.completions import SGLangClient, checked_client
from dflash_eval.reference.conversation import Conversations
from dflash_eval.run.prepared import load_prompts
from dflash_eval.run.results import utc_now
from dflash_eval.target.files import load_tokenizer
from dflash_eval.walk.by_dataset import conversations

CONVENTION = "sglang: completion_tokens / spec_verify_ct"


@dataclass(frozen=True)
class ServedOptions:
    target: Path
    sglang_url: str
    out: Path
    prompts: Path | None
    num_prompts: int | None
    max_new_tokens: int
    thinking: bool
    block_size: int
    drafter: str
    step: int | None = None
    gpus: str | None = None


def run_served(options: ServedOptions, progress: Progress) -> ServedResults:
    """Every prompt through the server; the record is written to options.out."""
    prompts = load_prompts(options.prompts, options.num_prompts)
    client = checked_client(options.sglang_url, options.target, progress.say)
    talk = Conversations(load_tokenizer(options.target), options.thinking, options.max_new_tokens)
    rows: list[ServedPrompt] = []
    progress.progress("served", 0, len(prompts))
    for done, prompt in enumerate(prompts, start=1):
        rows.append(_ask(client, talk, prompt, options.max_new_tokens))
        progress.progress("served", done, len(prompts))
    assert client.served is not None, "checked_client asked the server what it serves"
    results = ServedResults(
        kind=KIND,
        schema_version=SCHEMA_VERSION,
        step=options.step,
        server={
            "algorithm": "DFLASH",
            "num_draft_tokens": options.block_size,
            "drafter": options.drafter,
            "target": str(options.target),
            "version": client.served.version,
            "gpus": options.gpus,
        },
        settings={
            "max_new_tokens": options.max_new_tokens,
            "thinking": options.thinking,
            "temperature": 0.0,
            "prompts_sha256": prompts_hash(prompts),
            "prompts": len(prompts),
        },
        served=served_tau(rows),
        per_prompt=rows,
        created_at=utc_now(),
    )
    options.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


def _ask(client: SGLangClient, talk: Conversations, prompt: Prompt, budget: int) -> ServedPrompt:
    ids = talk.encode(prompt)
    body = client.generate(ids, budget)
    meta: dict[str, Any] = body.get("meta_info") or {}
    completion = meta.get("completion_tokens")
    verify = meta.get("spec_verify_ct")
    if not isinstance(completion, int) or (verify is None and completion > 1):
        raise HarnessError(
            f"SGLang at {client.shown} answered prompt {prompt.id} without "
            f"meta_info.completion_tokens and spec_verify_ct (found {sorted(meta)}): it is not "
            "speculating. Start it with --speculative-algorithm DFLASH (fab served-eval does)."
        )
    verify = int(verify or 0)  # SGLang leaves the field out while no round ran
    talk.replied(prompt, list(body["output_ids"]))
    return ServedPrompt(
        id=prompt.id,
        conversation=talk.first_turn(prompt),
        prompt_tokens=len(ids),
        completion_tokens=completion,
        verify_steps=verify,
        tau=completion / verify if verify else None,
    )


def served_tau(rows: list[ServedPrompt]) -> ServedTau:
    """Macro and pooled served τ with the CPU τ's bootstrap (units: conversations)."""
    # The rows with a verification step, by conversation (CPU τ's rows count rounds).
    units = conversations([{**row, "rounds": row["verify_steps"]} for row in rows])
    bootstrap = Bootstrap(len(units))

    def ratio(part: Any) -> Any:
        found = bootstrap.ratio_of_parts(units, part)
        return found.as_dict() if found else None

    return ServedTau(
        tau_macro=ratio(lambda row: (row["tau"], 1)),
        tau_pooled=ratio(lambda row: (row["completion_tokens"], row["verify_steps"])),
        completion_tokens=sum(row["completion_tokens"] for row in rows),
        verify_steps=sum(row["verify_steps"] for row in rows),
        convention=CONVENTION,
    )
