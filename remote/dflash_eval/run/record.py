"""The results record of one eval run, assembled in one place from the run's objects.

evaluate.py runs the phases and hands over what they produced (`RunParts`, one `Evaluated`
per drafter); `results` turns them into a `schema.Results`, block by block. The types in
contract/schema.py say what every field holds; this module only says where each value comes from.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval.contract.prompts import prompt_sets, prompts_hash
from dflash_eval.contract.schema import (
    KIND,
    SCHEMA_VERSION,
    CacheCounts,
    Checkpoint,
    Comparison,
    Completions,
    Drafter,
    Features,
    Harness,
    Prompts,
    Reference,
    Results,
    Target,
)
from dflash_eval.contract.schema_metrics import Metrics, PromptRow, Throughput
from dflash_eval.contract.urls import redact_url
from dflash_eval.contract.version import NUMERICS_VERSION, harness_hash
from dflash_eval.drafter.provenance import json_value
from dflash_eval.reference import pipeline
from dflash_eval.reference.cache_keys import LOCAL_SAMPLED
from dflash_eval.reference.conversation import template_reads_thinking
from dflash_eval.reference.sequence import Sequence
from dflash_eval.run.results import file_identity, host_info, utc_now
from dflash_eval.walk.by_dataset import acceptance_counts, intervals
from dflash_eval.walk.sampled import SampledWalk, prompt_columns

if TYPE_CHECKING:
    from dflash_eval.contract.progress import Timer
    from dflash_eval.contract.prompts import Prompt
    from dflash_eval.drafter.loaders import LoadedDrafter
    from dflash_eval.reference.conversation import Conversations
    from dflash_eval.run.options import EvalOptions
    from dflash_eval.run.prepared import PreparedRun
    from dflash_eval.target.source import TargetSource
    from dflash_eval.walk.metrics import PromptWalk


@dataclass
class DrafterRun:
    """One drafter's walks over all sequences, its cost and its decoded samples."""

    walks: list[Any]  # PromptWalk, or SampledWalk at T > 0
    blocks: int
    seconds: float
    samples: list[dict[str, Any]]


@dataclass
class Evaluated:
    """One drafter's part of a run: as loaded and identified, walked, summarised."""

    loaded: LoadedDrafter
    identity: Checkpoint
    run: DrafterRun
    metrics: Metrics


@dataclass
class RunParts:
    """Everything else the record reads, as the phases of evaluate.run_eval left it."""

    run: PreparedRun
    target: TargetSource  # with its tokenizer, stop ids and identity
    lookup: pipeline.Lookup
    libraries: dict[str, str | None]
    features: dict[str, Any]  # the features record, before the load facts
    sequences: list[Sequence]
    conversations: Conversations
    warnings: list[str]

    @property
    def options(self) -> EvalOptions:
        return self.run.options

    @property
    def prompts(self) -> list[Prompt]:
        return self.run.prompts

    @property
    def threads(self) -> int:
        return self.run.threads


def results(
    parts: RunParts,
    drafter: Evaluated,
    reference: Evaluated | None,
    timer: Timer,
    started: float,
) -> Results:
    """The whole record; the intervals (from the per-prompt rows) are its last phase."""
    options = parts.options
    rows = per_prompt(parts.sequences, drafter.run.walks, options.ddtree, parts.conversations)
    with timer.phase("intervals"):  # no DDTree at T > 0
        by_dataset = intervals(rows, parts.run.ddtree_budgets)
    timer.seconds["total"] = time.perf_counter() - started
    reference_block = reference_record(reference) if reference else None
    return Results(
        schema_version=SCHEMA_VERSION,
        kind=KIND,
        created_at=utc_now(),
        checkpoint=drafter.identity,
        drafter=drafter_block(drafter.loaded),
        target=target_block(parts),
        prompts=prompts_block(parts),
        completions=completions_block(options, parts.lookup),
        harness=Harness(
            content_sha256=harness_hash(),
            numerics_version=NUMERICS_VERSION,
            predictor="per-block" if options.per_block else "batched",
        ),
        libraries=parts.libraries,
        features=Features(
            **parts.features,
            target_load=parts.target.load_record(),
            cache=cache_counts(parts.sequences),
        ),
        host=host_info(parts.threads, parts.options.device),
        options=options_record(options),
        timings_s={name: round(s, 4) for name, s in timer.seconds.items()},
        throughput=throughput(drafter.run.blocks, drafter.run.seconds),
        metrics=drafter.metrics,
        per_prompt=rows,
        by_dataset=by_dataset,
        samples=drafter.run.samples,
        reference=reference_block,
        comparison=comparison(drafter.metrics, reference_block),
        warnings=parts.warnings,
    )


def checkpoint_identity(
    loaded: LoadedDrafter, step: int | None, verify: bool, training_run: str | None = None
) -> Checkpoint:
    source = loaded.source
    identity = Checkpoint(
        path=str(source.path),
        format=source.kind,
        **file_identity(source.files, verify),
        step=step if step is not None else source.step,
        step_source="--step" if step is not None else source.step_source,
        stripped_prefix=source.stripped_prefix,
        renamed_parameters=source.renamed_parameters,
        dropped_entries=source.dropped_entries,
        ignored_parameters=loaded.ignored_parameters,
        pickle=source.pickle.to_dict() if source.pickle else None,
    )
    if training_run:
        identity["training_run"] = training_run
    return identity


def drafter_block(loaded: LoadedDrafter) -> Drafter:
    return Drafter(
        architecture=loaded.config.to_hf_dict()["architectures"][0],
        config=loaded.config.to_hf_dict(),
        config_source=loaded.config_source,
        attention=loaded.config.attention_record(),
        accepted_config_keys=dict(loaded.config.accepted_keys),
        config_notes=loaded.notes,
        settings={name: json_value(s.value) for name, s in loaded.settings.items()},
        provenance=loaded.provenance(),
        accepted_defaults=loaded.accepted_defaults(),
        profile=loaded.profile.record() if loaded.profile else None,
        trained_block_size=loaded.trained_block_size,
        eval_block_size=loaded.config.block_size,
        dtype=loaded.dtype,
        parameters=sum(p.numel() for p in loaded.model.parameters()),
    )


def target_block(parts: RunParts) -> Target:
    target, identity = parts.target, parts.target.identity
    return Target(
        path=str(parts.options.target),
        name=identity["name"],
        family=target.family,
        dtype=str(target.dtype).removeprefix("torch."),
        num_layers=target.shape.num_layers,
        hidden_size=target.shape.hidden_size,
        vocab_size=target.shape.vocab_size,
        fingerprint=identity["fingerprint"],
        files=identity["files"],
    )


def prompts_block(parts: RunParts) -> Prompts:
    options, prompts, tokenizer = parts.options, parts.prompts, parts.target.tokenizer
    return Prompts(
        source=str(options.prompts) if options.prompts else "builtin",
        count=len(prompts),
        sha256=prompts_hash(prompts),
        chat_template=bool(getattr(tokenizer, "chat_template", None)),
        thinking="on" if options.thinking else "off",
        template_reads_thinking=template_reads_thinking(tokenizer),
        datasets=prompt_sets(prompts),
        max_new_tokens=options.max_new_tokens,
        stop_token_ids=parts.target.stops,
    )


def completions_block(options: EvalOptions, lookup: pipeline.Lookup) -> Completions:
    source = lookup.completion_source
    from_sglang = source not in (pipeline.LOCAL_GREEDY, LOCAL_SAMPLED)
    if options.features is None:
        url = redact_url(options.sglang_url) if options.sglang_url else None
    else:
        url = source.removeprefix("sglang ") if from_sglang else None
    return Completions(
        source="sglang" if from_sglang else source,  # local-greedy or local-sampled
        sglang_url=url,
        extra_tokens=lookup.extra_tokens,
        sglang_model=lookup.served["model_path"] if lookup.served else None,
        sglang_version=lookup.served["version"] if lookup.served else None,
    )


def reference_record(reference: Evaluated) -> Reference:
    return Reference(
        checkpoint=reference.identity,
        drafter=drafter_block(reference.loaded),
        metrics=reference.metrics,
        throughput=throughput(reference.run.blocks, reference.run.seconds),
        samples=reference.run.samples,
    )


def throughput(blocks: int, seconds: float) -> Throughput:
    return Throughput(
        blocks=blocks,
        seconds=round(seconds, 4),
        blocks_per_s=round(blocks / seconds, 2) if seconds > 0 else None,
    )


def per_prompt(
    sequences: list[Sequence],
    walks: list[PromptWalk] | list[SampledWalk],
    budgets: list[int],
    conversations: Conversations,
) -> list[PromptRow]:
    """One row per prompt; at T > 0 its columns average its paths (the row's other facts
    are its first path's, its cache flags hold for all of them)."""
    paths: dict[str, list[tuple[Sequence, Any]]] = {}
    for seq, walked in zip(sequences, walks, strict=True):
        paths.setdefault(seq.prompt.id, []).append((seq, walked))
    rows = []
    for walked_paths in paths.values():
        seq = walked_paths[0][0]
        assert seq.span is not None, "references are made before the walks"
        rows.append(
            PromptRow(
                id=seq.prompt.id,
                dataset=seq.prompt.dataset,
                conversation=conversations.first_turn(seq.prompt),
                prompt_tokens=len(seq.prompt_ids),
                completion_tokens=len(seq.completion),
                stopped=seq.span.stop is not None and seq.span.stop < seq.span.limit,
                reference_tokens=len(seq.reference),
                **_walk_columns([walked for _, walked in walked_paths], budgets),
                cache={
                    "completion": all(s.completion_hit for s, _ in walked_paths),
                    "hidden_states": all(s.hidden_hit for s, _ in walked_paths),
                },
            )
        )
    return rows


def _walk_columns(paths: list[Any], budgets: list[int]) -> dict[str, Any]:
    """A row's metric columns (PromptRow's `acceptance`, `rounds`, `tau`, `ddtree_tau`,
    `tau_capped`): counted at T = 0, expected given each path at T > 0 (prompt_columns)."""
    if isinstance(paths[0], SampledWalk):
        return prompt_columns(paths)
    (walked,) = paths
    return {
        "acceptance": acceptance_counts(walked.slot_correct),
        "rounds": len(walked.lengths),
        "tau": mean(walked.lengths),
        "ddtree_tau": {str(b): mean(walked.ddtree_lengths[b]) for b in budgets},
        "tau_capped": mean(walked.capped_lengths),
    }


def cache_counts(sequences: list[Sequence]) -> CacheCounts:
    return CacheCounts(
        completion_hits=sum(s.completion_hit for s in sequences),
        hidden_state_hits=sum(s.hidden_hit for s in sequences),
        prompts=len(sequences),
    )


def mean(lengths: list[int]) -> float | None:
    return sum(lengths) / len(lengths) if lengths else None


def comparison(metrics: Metrics, reference: Reference | None) -> Comparison | None:
    if reference is None:
        return None
    theirs = reference["metrics"]
    if theirs["block_size"] != metrics["block_size"]:
        # τ grows with the block: a ratio across block sizes says nothing about the drafter.
        return Comparison(tau_macro=None, tau_pooled=None)
    return Comparison(
        tau_macro=_ratio(metrics["tau_macro"], theirs["tau_macro"]),
        tau_pooled=_ratio(metrics["tau_pooled"], theirs["tau_pooled"]),
    )


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours and theirs else None


def options_record(options: EvalOptions) -> dict[str, Any]:
    record = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()}
    if options.sglang_url:
        record["sglang_url"] = redact_url(options.sglang_url)
    return record
