"""One evaluation run: load → completions → hidden states → drafter walks → results JSON.

Phases (each timed, each reporting progress events):
1. load the target and the drafter(s), checking that they fit each other;
2. reference completions g per prompt (cache, else local greedy or SGLang);
3. target hidden states over prompt + completion (cache, else one forward per prompt);
4. drafter predictions for the anchors of each completion (batched) and the acceptance walks.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dflash_eval import schema
from dflash_eval.by_dataset import acceptance_counts, intervals
from dflash_eval.cache import DiskCache, tokens_digest
from dflash_eval.completions import (
    Prompt,
    SGLangClient,
    builtin_prompts,
    prompt_sets,
    prompts_hash,
    read_prompts_jsonl,
    template_reads_thinking,
)
from dflash_eval.conversation import Conversations
from dflash_eval.errors import HarnessError
from dflash_eval.loaders import LoadedDrafter, load_drafter
from dflash_eval.metrics import PromptWalk, summarize, walk_prompt
from dflash_eval.predict import BorrowedHead, PerBlockPredictor, Predictor
from dflash_eval.progress import Progress, Timer
from dflash_eval.results import (
    file_identity,
    host_info,
    library_versions,
    utc_now,
    write_results,
)
from dflash_eval.target import (
    DTYPES,
    Target,
    load_target,
    load_tokenizer,
    stop_token_ids,
    target_identity,
)
from dflash_eval.version import harness_hash


@dataclass
class EvalOptions:
    checkpoint: Path
    target: Path
    out: Path
    drafter_config: Path | None = None
    block_size: int | None = None
    mask_token_id: int | None = None
    target_layer_ids: list[int] | None = None
    prompts: Path | None = None
    num_prompts: int | None = None
    max_new_tokens: int = 256
    max_blocks: int | None = None
    ddtree: list[int] = field(default_factory=lambda: [4, 8, 16, 32])
    threads: int | None = None
    reference_drafter: Path | None = None
    sglang_url: str | None = None
    cache_dir: Path | None = None
    dtype: str = "float32"
    target_dtype: str = "auto"
    allow_unsafe_pickle: bool = False
    chunk: int | None = None
    per_block: bool = False
    step: int | None = None
    thinking: bool = False  # enable_thinking for chat templates that have it


@dataclass
class Sequence:
    """One prompt with its completion and (after phase 3) its target features."""

    prompt: Prompt
    prompt_ids: list[int]
    completion: list[int] = field(default_factory=list)
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    completion_hit: bool = False
    hidden_hit: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.completion


def run_eval(options: EvalOptions, progress: Progress) -> dict[str, Any]:
    started = time.perf_counter()
    timer = Timer()
    if options.threads:
        torch.set_num_threads(options.threads)
    threads = torch.get_num_threads()
    _check_paths(options)
    if any(b < 1 for b in options.ddtree):
        raise HarnessError(f"--ddtree budgets must be positive integers, got {options.ddtree}.")
    prompts = _prompts(options)
    progress.event(
        "start",
        checkpoint=str(options.checkpoint),
        target=str(options.target),
        out=str(options.out),
        threads=threads,
    )
    warnings: list[str] = []

    with timer.phase("load_target"):
        progress.say(f"Loading target {options.target} …")
        target = load_target(options.target, options.target_dtype)
        tokenizer = load_tokenizer(options.target)
        stops = stop_token_ids(options.target, tokenizer)
    with timer.phase("load_drafter"):
        drafter = _load(options.checkpoint, options, target, progress, warnings, main=True)
        reference = (
            _load(options.reference_drafter, options, target, progress, warnings, main=False)
            if options.reference_drafter
            else None
        )
    with timer.phase("hash"):
        checkpoint_identity = _checkpoint_identity(drafter, options.step)
        reference_identity = _checkpoint_identity(reference, None) if reference else None
        identity = target_identity(options.target)

    # Later turns of a conversation are encoded once the turn before has its completion.
    conversations = Conversations(tokenizer, options.thinking, options.max_new_tokens)
    sequences = [Sequence(p, [] if p.follows else conversations.encode(p)) for p in prompts]
    used_chat_template = bool(getattr(tokenizer, "chat_template", None))
    if options.thinking and not template_reads_thinking(tokenizer):
        warnings.append("--thinking on, but the target's chat template has no thinking switch")
        progress.warn(warnings[-1])
    cache = DiskCache(options.cache_dir)
    libraries = library_versions()
    # What every cached completion and hidden-state entry depends on.
    shared_key = {
        "target": identity["fingerprint"],
        "target_dtype": str(target.dtype),
        "libraries": libraries,
        "device": "cpu",
    }
    with timer.phase("completions"):
        _completions(sequences, options, target, stops, shared_key, cache, conversations, progress)
    for seq in sequences:
        if len(seq.completion) < 2:
            count = len(seq.completion)
            warnings.append(f"prompt {seq.prompt.id}: completion has {count} tokens; no rounds")
            progress.warn(warnings[-1])
    layer_ids = sorted(
        set(drafter.config.target_layer_ids)
        | (set(reference.config.target_layer_ids) if reference else set())
    )
    with timer.phase("hidden_states"):
        _hidden_states(sequences, layer_ids, target, shared_key, cache, progress)
    target.release_body()

    with timer.phase("drafter"):
        walks, blocks, seconds = _walk_all(drafter, "drafter", sequences, target, options, progress)
    metrics = summarize(walks, drafter.config.block_size, options.ddtree)
    reference_block = None
    if reference is not None:
        with timer.phase("reference_drafter"):
            ref_walks, ref_blocks, ref_seconds = _walk_all(
                reference, "reference_drafter", sequences, target, options, progress
            )
        reference_metrics = summarize(ref_walks, reference.config.block_size, options.ddtree)
        reference_block = {
            schema.CHECKPOINT: reference_identity,
            schema.DRAFTER: _drafter_block(reference, options),
            schema.METRICS: reference_metrics,
            schema.THROUGHPUT: _throughput(ref_blocks, ref_seconds),
        }
    per_prompt = _per_prompt(sequences, walks, options.ddtree, conversations)
    with timer.phase("intervals"):
        by_dataset = intervals(per_prompt, options.ddtree)
    timer.seconds[schema.TOTAL_SECONDS] = time.perf_counter() - started
    results = {
        schema.SCHEMA_VERSION_KEY: schema.SCHEMA_VERSION,
        schema.KIND_KEY: schema.KIND,
        schema.CREATED_AT: utc_now(),
        schema.CHECKPOINT: checkpoint_identity,
        schema.DRAFTER: _drafter_block(drafter, options),
        schema.TARGET: {
            "path": str(options.target),
            schema.TARGET_NAME: identity["name"],
            schema.TARGET_FAMILY: target.family,
            "dtype": str(target.dtype).removeprefix("torch."),
            "num_layers": target.num_layers,
            "hidden_size": target.shape.hidden_size,
            "vocab_size": target.shape.vocab_size,
            schema.TARGET_FINGERPRINT: identity["fingerprint"],
            "files": identity["files"],
        },
        schema.PROMPTS: {
            "source": str(options.prompts) if options.prompts else "builtin",
            schema.PROMPT_COUNT: len(prompts),
            schema.PROMPTS_SHA256: prompts_hash(prompts),
            "chat_template": used_chat_template,
            schema.THINKING: "on" if options.thinking else "off",
            "template_reads_thinking": template_reads_thinking(tokenizer),
            schema.PROMPT_SETS: prompt_sets(prompts),
            schema.MAX_NEW_TOKENS: options.max_new_tokens,
            "stop_token_ids": stops,
        },
        schema.COMPLETIONS: {
            schema.COMPLETIONS_SOURCE: "sglang" if options.sglang_url else "local-greedy",
            "sglang_url": options.sglang_url,
        },
        schema.HARNESS: {
            schema.HARNESS_SHA256: harness_hash(),
            "predictor": "per-block" if options.per_block else "batched",
        },
        schema.LIBRARIES: libraries,
        schema.HOST: host_info(threads),
        schema.OPTIONS: _options_record(options),
        schema.TIMINGS: {name: round(s, 4) for name, s in timer.seconds.items()},
        schema.THROUGHPUT: _throughput(blocks, seconds),
        schema.METRICS: metrics,
        schema.PER_PROMPT: per_prompt,
        schema.BY_DATASET: by_dataset,
        schema.REFERENCE: reference_block,
        schema.COMPARISON: _comparison(metrics, reference_block),
        schema.WARNINGS: warnings,
    }
    write_results(options.out, results)
    return results


def _check_paths(options: EvalOptions) -> None:
    """Fail in a second, not after loading a large target, when an input is missing."""
    inputs = [("--checkpoint", options.checkpoint), ("--target", options.target)]
    inputs += [("--reference-drafter", options.reference_drafter)] * bool(options.reference_drafter)
    inputs += [("--prompts", options.prompts)] * bool(options.prompts)
    inputs += [("--drafter-config", options.drafter_config)] * bool(options.drafter_config)
    for flag, path in inputs:
        if not Path(path).exists():
            raise HarnessError(
                f"{flag} {path} does not exist on this host. Check the path; checkpoints "
                "must be staged to the eval host before they can be evaluated."
            )
    outputs = [("--out", Path(options.out).parent)]
    outputs += [("--cache-dir", options.cache_dir)] * bool(options.cache_dir)
    for flag, directory in outputs:
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=directory).close()
        except OSError as error:
            raise HarnessError(
                f"{flag}: cannot write in {directory} ({error.strerror}). Choose a writable "
                "directory (and check free space) before a long run, not after it."
            ) from None


def _load(
    path: Path,
    options: EvalOptions,
    target: Target,
    progress: Progress,
    warnings: list[str],
    main: bool,
) -> LoadedDrafter:
    role = "drafter" if main else "reference drafter"
    progress.say(f"Loading {role} {path} …")
    loaded = load_drafter(
        path,
        target.shape,
        config_file=options.drafter_config if main else None,
        block_size=options.block_size if main else None,
        mask_token_id=options.mask_token_id if main else None,
        target_layer_ids=options.target_layer_ids if main else None,
        allow_unsafe_pickle=options.allow_unsafe_pickle,
        dtype=DTYPES[options.dtype],
    )
    source = loaded.source
    progress.say(
        f"  {role}: {source.kind}, config from {loaded.config_source}, step {source.step}"
        f" ({source.step_source}), block size {loaded.config.block_size}, "
        f"target layers {list(loaded.config.target_layer_ids)}"
    )
    for note in loaded.notes:
        progress.say(f"  {role}: {note}")
    if loaded.ignored_parameters:
        progress.say(f"  {role}: set aside target copies {loaded.ignored_parameters}")
    for warning in loaded.warnings:
        warnings.append(f"{role}: {warning}")
        progress.warn(warnings[-1])
    return loaded


def _checkpoint_identity(loaded: LoadedDrafter, step: int | None) -> dict[str, Any]:
    source = loaded.source
    return {
        schema.PATH: str(source.path),
        "format": source.kind,
        **file_identity(source.files),
        schema.STEP: step if step is not None else source.step,
        "step_source": "--step" if step is not None else source.step_source,
        "stripped_prefix": source.stripped_prefix,
        "dropped_entries": source.dropped_entries,
        "ignored_parameters": loaded.ignored_parameters,
    }


def _drafter_block(loaded: LoadedDrafter, options: EvalOptions) -> dict[str, Any]:
    return {
        "config": loaded.config.to_hf_dict(),
        "config_source": loaded.config_source,
        "config_notes": loaded.notes,
        "trained_block_size": loaded.trained_block_size,
        "eval_block_size": loaded.config.block_size,
        "dtype": options.dtype,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
    }


def _prompts(options: EvalOptions) -> list[Prompt]:
    prompts = read_prompts_jsonl(options.prompts) if options.prompts else builtin_prompts()
    if options.num_prompts is not None:
        if options.num_prompts < 1:
            raise HarnessError(f"--num-prompts must be at least 1, got {options.num_prompts}.")
        prompts = prompts[: options.num_prompts]
    return prompts


def _completions(
    sequences: list[Sequence],
    options: EvalOptions,
    target: Target,
    stops: list[int],
    shared_key: dict[str, Any],
    cache: DiskCache,
    conversations: Conversations,
    progress: Progress,
) -> None:
    client = SGLangClient(options.sglang_url) if options.sglang_url else None
    total = len(sequences)
    progress.progress("completions", 0, total)
    for done, seq in enumerate(sequences, start=1):
        if seq.prompt.follows:
            seq.prompt_ids = conversations.encode(seq.prompt)
        key = {
            **shared_key,
            "kind": "completion",
            "source": f"sglang {options.sglang_url}" if client else "local-greedy",
            "prompt_tokens": tokens_digest(seq.prompt_ids),
            "max_new_tokens": options.max_new_tokens,
            "stop_token_ids": stops,
        }
        cached = cache.get_completion(key)
        seq.completion_hit = cached is not None
        if cached is None:
            if client is not None:
                completion = client.complete(seq.prompt_ids, options.max_new_tokens)
            else:
                completion = target.greedy(seq.prompt_ids, options.max_new_tokens, stops)
            cached = _cut_at_stop(completion, stops)
            cache.put_completion(key, cached)
        seq.completion = cached
        conversations.replied(seq.prompt, seq.completion)
        progress.progress("completions", done, total)


def _cut_at_stop(completion: list[int], stops: list[int]) -> list[int]:
    for index, token in enumerate(completion):
        if token in stops:
            return completion[: index + 1]
    return completion


def _hidden_states(
    sequences: list[Sequence],
    layer_ids: list[int],
    target: Target,
    shared_key: dict[str, Any],
    cache: DiskCache,
    progress: Progress,
) -> None:
    total = len(sequences)
    progress.progress("hidden_states", 0, total)
    for done, seq in enumerate(sequences, start=1):
        key = {
            **shared_key,
            "kind": "hidden_states",
            "tokens": tokens_digest(seq.tokens),
            "num_tokens": len(seq.tokens),
            "layer_ids": layer_ids,
        }
        hidden = cache.get_hidden(key)
        seq.hidden_hit = hidden is not None
        if hidden is None:
            hidden = target.hidden_features(seq.tokens, layer_ids)
            cache.put_hidden(key, hidden)
        expected = (len(seq.tokens), target.shape.hidden_size)
        if any(tuple(h.shape) != expected for h in hidden.values()):
            raise HarnessError(
                f"Hidden states for prompt {seq.prompt.id} have shapes "
                f"{[tuple(h.shape) for h in hidden.values()]}, expected {expected}. "
                f"Delete the cache directory and re-run."
            )
        seq.hidden = hidden
        progress.progress("hidden_states", done, total)


def _walk_all(
    loaded: LoadedDrafter,
    phase: str,
    sequences: list[Sequence],
    target: Target,
    options: EvalOptions,
    progress: Progress,
) -> tuple[list[PromptWalk], int, float]:
    config = loaded.config
    dtype = DTYPES[options.dtype]
    head = BorrowedHead.from_target(
        target.embed_weight, target.head_weight, config.mask_token_id, dtype
    )
    predictor_class = PerBlockPredictor if options.per_block else Predictor
    top_k = max([1, *options.ddtree])
    walks, blocks, seconds = [], 0, 0.0
    total = len(sequences)
    progress.progress(phase, 0, total)
    for done, seq in enumerate(sequences, start=1):
        first_anchor = len(seq.prompt_ids)
        features = torch.cat([seq.hidden[i] for i in config.target_layer_ids], dim=-1)
        predictor = predictor_class(
            loaded.model,
            head,
            seq.tokens,
            features.to(dtype),
            first_anchor,
            config.block_size,
            top_k,
            chunk=1 if options.per_block else options.chunk,
        )
        walks.append(
            walk_prompt(
                predictor,
                seq.tokens,
                first_anchor,
                config.block_size,
                options.ddtree,
                options.max_blocks,
            )
        )
        blocks += predictor.blocks_computed
        seconds += predictor.seconds
        progress.progress(phase, done, total)
    return walks, blocks, seconds


def _throughput(blocks: int, seconds: float) -> dict[str, Any]:
    return {
        schema.BLOCKS: blocks,
        schema.SECONDS: round(seconds, 4),
        schema.BLOCKS_PER_S: round(blocks / seconds, 2) if seconds > 0 else None,
    }


def _per_prompt(
    sequences: list[Sequence],
    walks: list[PromptWalk],
    budgets: list[int],
    conversations: Conversations,
) -> list[dict[str, Any]]:
    rows = []
    for seq, walked in zip(sequences, walks, strict=True):
        lengths = walked.lengths
        rows.append(
            {
                "id": seq.prompt.id,
                schema.PROMPT_DATASET: seq.prompt.dataset,
                schema.PROMPT_CONVERSATION: conversations.first_turn(seq.prompt),
                schema.PROMPT_ACCEPTANCE: acceptance_counts(walked.slot_correct),
                "prompt_tokens": len(seq.prompt_ids),
                "completion_tokens": len(seq.completion),
                "rounds": len(lengths),
                "tau": sum(lengths) / len(lengths) if lengths else None,
                "ddtree_tau": {
                    str(b): sum(walked.ddtree_lengths[b]) / len(walked.ddtree_lengths[b])
                    if walked.ddtree_lengths[b]
                    else None
                    for b in budgets
                },
                "cache": {"completion": seq.completion_hit, "hidden_states": seq.hidden_hit},
            }
        )
    return rows


def _comparison(metrics: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any] | None:
    if reference is None:
        return None
    theirs = reference[schema.METRICS]
    return {
        name: (metrics[name] / theirs[name]) if metrics[name] and theirs[name] else None
        for name in (schema.TAU_MACRO, schema.TAU_POOLED)
    }


def _options_record(options: EvalOptions) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()}
