"""The parts of a results dict built from a run's objects: checkpoint identity, drafter block,
per-prompt rows, throughput, the reference comparison, the options as given.

Key names come from dflash_eval.schema; docs/results-schema.md says what each holds.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval import schema
from dflash_eval.by_dataset import acceptance_counts
from dflash_eval.provenance import json_value
from dflash_eval.results import file_identity
from dflash_eval.urls import redact_url

if TYPE_CHECKING:
    from dflash_eval.conversation import Conversations
    from dflash_eval.evaluate import EvalOptions
    from dflash_eval.loaders import LoadedDrafter
    from dflash_eval.metrics import PromptWalk
    from dflash_eval.pipeline import Sequence


def checkpoint_identity(loaded: LoadedDrafter, step: int | None, verify: bool) -> dict[str, Any]:
    source = loaded.source
    return {
        schema.PATH: str(source.path),
        "format": source.kind,
        **file_identity(source.files, verify),
        schema.STEP: step if step is not None else source.step,
        "step_source": "--step" if step is not None else source.step_source,
        "stripped_prefix": source.stripped_prefix,
        "renamed_parameters": source.renamed_parameters,
        "dropped_entries": source.dropped_entries,
        "ignored_parameters": loaded.ignored_parameters,
        "pickle": source.pickle.to_dict() if source.pickle else None,
    }


def drafter_block(loaded: LoadedDrafter) -> dict[str, Any]:
    return {
        "config": loaded.config.to_hf_dict(),
        "config_source": loaded.config_source,
        schema.ATTENTION: loaded.config.attention_record(),
        schema.ACCEPTED_KEYS: dict(loaded.config.accepted_keys),
        "config_notes": loaded.notes,
        schema.SETTINGS: {name: json_value(s.value) for name, s in loaded.settings.items()},
        schema.SETTINGS_PROVENANCE: loaded.provenance(),
        schema.ACCEPTED_DEFAULTS: loaded.accepted_defaults(),
        "profile": loaded.profile.record() if loaded.profile else None,
        "trained_block_size": loaded.trained_block_size,
        "eval_block_size": loaded.config.block_size,
        "dtype": loaded.dtype,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
    }


def throughput(blocks: int, seconds: float) -> dict[str, Any]:
    return {
        schema.BLOCKS: blocks,
        schema.SECONDS: round(seconds, 4),
        schema.BLOCKS_PER_S: round(blocks / seconds, 2) if seconds > 0 else None,
    }


def per_prompt(
    sequences: list[Sequence],
    walks: list[PromptWalk],
    budgets: list[int],
    conversations: Conversations,
) -> list[dict[str, Any]]:
    rows = []
    for seq, walked in zip(sequences, walks, strict=True):
        assert seq.span is not None, "references are made before the walks"
        rows.append(
            {
                "id": seq.prompt.id,
                schema.PROMPT_DATASET: seq.prompt.dataset,
                schema.PROMPT_CONVERSATION: conversations.first_turn(seq.prompt),
                schema.PROMPT_ACCEPTANCE: acceptance_counts(walked.slot_correct),
                "prompt_tokens": len(seq.prompt_ids),
                "completion_tokens": len(seq.completion),
                "stopped": seq.span.stop is not None and seq.span.stop < seq.span.limit,
                "reference_tokens": len(seq.reference),
                "rounds": len(walked.lengths),
                "tau": mean(walked.lengths),
                "ddtree_tau": {str(b): mean(walked.ddtree_lengths[b]) for b in budgets},
                "tau_capped": mean(walked.capped_lengths),
                "cache": {"completion": seq.completion_hit, "hidden_states": seq.hidden_hit},
            }
        )
    return rows


def cache_counts(sequences: list[Sequence]) -> dict[str, int]:
    return {
        "completion_hits": sum(s.completion_hit for s in sequences),
        "hidden_state_hits": sum(s.hidden_hit for s in sequences),
        "prompts": len(sequences),
    }


def mean(lengths: list[int]) -> float | None:
    return sum(lengths) / len(lengths) if lengths else None


def comparison(metrics: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any] | None:
    if reference is None:
        return None
    theirs = reference[schema.METRICS]
    if theirs[schema.BLOCK_SIZE] != metrics[schema.BLOCK_SIZE]:
        # τ grows with the block: a ratio across block sizes says nothing about the drafter.
        return {schema.TAU_MACRO: None, schema.TAU_POOLED: None}
    return {
        name: (metrics[name] / theirs[name]) if metrics[name] and theirs[name] else None
        for name in (schema.TAU_MACRO, schema.TAU_POOLED)
    }


def options_record(options: EvalOptions) -> dict[str, Any]:
    record = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()}
    if options.sglang_url:
        record["sglang_url"] = redact_url(options.sglang_url)
    return record
