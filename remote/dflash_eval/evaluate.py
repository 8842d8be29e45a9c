"""One evaluation run: load → completions → hidden states → drafter walks → results JSON.

Phases (each timed, each reporting progress events):
1. load the target and the drafter(s), checking that they fit each other;
2. reference completions g per prompt (cache, else local greedy or SGLang);
3. target hidden states over prompt + completion (cache, else one forward per prompt);
4. drafter predictions for the anchors of each completion (batched) and the acceptance walks.

The reference of each prompt is its completion plus `block size` more greedy tokens, so
that the walk scores every round as z-lab's live loop counts it (metrics.py).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dflash_eval.cache import DiskCache, tokens_digest
from dflash_eval.completions import (
    Prompt,
    SGLangClient,
    builtin_prompts,
    encode_prompt,
    first_stop,
    greedy_reference,
    prompts_hash,
    read_prompts_jsonl,
)
from dflash_eval.errors import HarnessError
from dflash_eval.loaders import LoadedDrafter, load_drafter
from dflash_eval.metrics import PromptWalk, Span, summarize, walk_prompt
from dflash_eval.predict import BorrowedHead, PerBlockPredictor, Predictor
from dflash_eval.progress import Progress, Timer
from dflash_eval.results import (
    SCHEMA_VERSION,
    file_identity,
    host_info,
    library_versions,
    utc_now,
    write_results,
)
from dflash_eval.samples import SAMPLE_PROMPTS, Decode, draft_sample, tokenizer_decoder
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


@dataclass
class Sequence:
    """One prompt with its reference (the completion and the tokens past its end), where
    its rounds run, and (after phase 3) its target features."""

    prompt: Prompt
    prompt_ids: list[int]
    reference: list[int] = field(default_factory=list)
    span: Span | None = None
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    completion_hit: bool = False
    hidden_hit: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.reference

    @property
    def completion(self) -> list[int]:
        """What the live loop outputs: max_new_tokens tokens, or through the stop token."""
        assert self.span is not None, "the completion is known once the reference is"
        return self.tokens[self.span.first_anchor : self.span.end]


@dataclass
class DrafterRun:
    """One drafter's walks over all sequences, its cost and its decoded samples."""

    walks: list[PromptWalk]
    blocks: int
    seconds: float
    samples: list[dict[str, Any]]


def run_eval(options: EvalOptions, progress: Progress) -> dict[str, Any]:
    started = time.perf_counter()
    timer = Timer()
    if options.threads:
        torch.set_num_threads(options.threads)
    threads = torch.get_num_threads()
    _check_paths(options)
    if any(b < 1 for b in options.ddtree):
        raise HarnessError(f"--ddtree budgets must be positive integers, got {options.ddtree}.")
    if options.max_new_tokens < 1:
        raise HarnessError(f"--max-new-tokens must be at least 1, got {options.max_new_tokens}.")
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

    sequences = [Sequence(p, encode_prompt(tokenizer, p)[0]) for p in prompts]
    used_chat_template = bool(getattr(tokenizer, "chat_template", None))
    cache = DiskCache(options.cache_dir)
    libraries = library_versions()
    # What every cached completion and hidden-state entry depends on.
    shared_key = {
        "target": identity["fingerprint"],
        "target_dtype": str(target.dtype),
        "libraries": libraries,
        "device": "cpu",
    }
    # The reference runs one block past the completion: the larger block when two
    # drafters share it.
    extra = max(d.config.block_size for d in (drafter, reference) if d is not None)
    with timer.phase("completions"):
        _completions(sequences, options, target, stops, extra, shared_key, cache, progress)
    layer_ids = sorted(
        set(drafter.config.target_layer_ids)
        | (set(reference.config.target_layer_ids) if reference else set())
    )
    with timer.phase("hidden_states"):
        _hidden_states(sequences, layer_ids, target, shared_key, cache, progress)
    target.release_body()

    decode = tokenizer_decoder(tokenizer)
    with timer.phase("drafter"):
        run = _walk_all(drafter, "drafter", sequences, target, options, decode, progress)
    metrics = summarize(run.walks, drafter.config.block_size, options.ddtree)
    _warn_about_walks(sequences, run.walks, "drafter", warnings, progress)
    reference_block = None
    if reference is not None:
        with timer.phase("reference_drafter"):
            ref_run = _walk_all(
                reference, "reference_drafter", sequences, target, options, decode, progress
            )
        reference_metrics = summarize(ref_run.walks, reference.config.block_size, options.ddtree)
        _warn_about_walks(sequences, ref_run.walks, "reference drafter", warnings, progress)
        reference_block = {
            "checkpoint": reference_identity,
            "drafter": _drafter_block(reference, options),
            "metrics": reference_metrics,
            "throughput": _throughput(ref_run.blocks, ref_run.seconds),
            "samples": ref_run.samples,
        }
    timer.seconds["total"] = time.perf_counter() - started
    results = {
        "schema_version": SCHEMA_VERSION,
        "kind": "dflash-eval-results",
        "created_at": utc_now(),
        "checkpoint": checkpoint_identity,
        "drafter": _drafter_block(drafter, options),
        "target": {
            "path": str(options.target),
            "name": identity["name"],
            "family": target.family,
            "dtype": str(target.dtype).removeprefix("torch."),
            "num_layers": target.num_layers,
            "hidden_size": target.shape.hidden_size,
            "vocab_size": target.shape.vocab_size,
            "fingerprint": identity["fingerprint"],
            "files": identity["files"],
        },
        "prompts": {
            "source": str(options.prompts) if options.prompts else "builtin",
            "count": len(prompts),
            "sha256": prompts_hash(prompts),
            "chat_template": used_chat_template,
            "max_new_tokens": options.max_new_tokens,
            "stop_token_ids": stops,
        },
        "completions": {
            "source": "sglang" if options.sglang_url else "local-greedy",
            "sglang_url": options.sglang_url,
            "extra_tokens": extra,
        },
        "harness": {
            "content_sha256": harness_hash(),
            "predictor": "per-block" if options.per_block else "batched",
        },
        "libraries": libraries,
        "host": host_info(threads),
        "options": _options_record(options),
        "timings_s": {name: round(s, 4) for name, s in timer.seconds.items()},
        "throughput": _throughput(run.blocks, run.seconds),
        "metrics": metrics,
        "per_prompt": _per_prompt(sequences, run.walks, options.ddtree),
        "samples": run.samples,
        "reference": reference_block,
        "comparison": _comparison(metrics, reference_block),
        "warnings": warnings,
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
        "path": str(source.path),
        "format": source.kind,
        **file_identity(source.files),
        "step": step if step is not None else source.step,
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
    wanted = options.num_prompts
    if wanted is not None:
        if wanted < 1:
            raise HarnessError(f"--num-prompts must be at least 1, got {wanted}.")
        if wanted > len(prompts):
            source = f"the file {options.prompts}" if options.prompts else "the built-in set"
            raise HarnessError(
                f"--num-prompts {wanted} asks for more prompts than {source} holds "
                f"({len(prompts)}). Pass --num-prompts {len(prompts)} or less, or a --prompts "
                f"JSONL file with at least {wanted} prompts."
            )
        prompts = prompts[:wanted]
    return prompts


def _completions(
    sequences: list[Sequence],
    options: EvalOptions,
    target: Target,
    stops: list[int],
    extra: int,
    shared_key: dict[str, Any],
    cache: DiskCache,
    progress: Progress,
) -> None:
    client = SGLangClient(options.sglang_url) if options.sglang_url else None
    total = len(sequences)
    progress.progress("completions", 0, total)
    for done, seq in enumerate(sequences, start=1):
        key = {
            **shared_key,
            "kind": "completion",
            "source": f"sglang {options.sglang_url}" if client else "local-greedy",
            "prompt_tokens": tokens_digest(seq.prompt_ids),
            "max_new_tokens": options.max_new_tokens,
            "stop_token_ids": stops,
            # Tokens past the completion's end (max_new_tokens or the stop token): entries
            # cut at the end, from before this rule, lack this field and so never match.
            "extra_tokens": extra,
        }
        reference = cache.get_completion(key)
        seq.completion_hit = reference is not None
        if reference is None:
            args = (seq.prompt_ids, options.max_new_tokens, extra, stops)
            if client is not None:
                reference = client.reference(*args)
            else:
                reference = greedy_reference(target.model, *args)
            cache.put_completion(key, reference)
        seq.reference = reference
        first, stop = len(seq.prompt_ids), first_stop(reference, stops)
        limit = first + options.max_new_tokens
        seq.span = Span(first, limit, None if stop is None else first + stop)
        progress.progress("completions", done, total)


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
    decode: Decode,
    progress: Progress,
) -> DrafterRun:
    config = loaded.config
    dtype = DTYPES[options.dtype]
    head = BorrowedHead.from_target(
        target.embed_weight, target.head_weight, config.mask_token_id, dtype
    )
    predictor_class = PerBlockPredictor if options.per_block else Predictor
    top_k = max([1, *options.ddtree])
    run = DrafterRun([], 0, 0.0, [])
    total = len(sequences)
    progress.progress(phase, 0, total)
    for done, seq in enumerate(sequences, start=1):
        span = seq.span
        assert span is not None, "references are made before the walks"
        features = torch.cat([seq.hidden[i] for i in config.target_layer_ids], dim=-1)
        predictor = predictor_class(
            loaded.model,
            head,
            seq.tokens,
            features.to(dtype),
            span.first_anchor,
            config.block_size,
            top_k,
            chunk=1 if options.per_block else options.chunk,
            last_anchor=span.limit - 1,  # no round starts at max_new_tokens or later
        )
        walked = walk_prompt(
            predictor, seq.tokens, span, config.block_size, options.ddtree, options.max_blocks
        )
        run.walks.append(walked)
        if done <= SAMPLE_PROMPTS:
            run.samples.append(
                draft_sample(
                    seq.prompt.id,
                    seq.tokens,
                    span.first_anchor,
                    span.end,
                    walked.anchors,
                    [length - 1 for length in walked.lengths],
                    predictor.draft,
                    config.block_size,
                    decode,
                )
            )
        run.blocks += predictor.blocks_computed
        run.seconds += predictor.seconds
        progress.progress(phase, done, total)
    return run


def _warn_about_walks(
    sequences: list[Sequence],
    walks: list[PromptWalk],
    role: str,
    warnings: list[str],
    progress: Progress,
) -> None:
    for seq, walked in zip(sequences, walks, strict=True):
        if not walked.lengths:
            warnings.append(
                f"{role}, prompt {seq.prompt.id}: no rounds (the reference has "
                f"{len(seq.reference)} tokens)"
            )
        elif not walked.reference_complete:
            warnings.append(
                f"{role}, prompt {seq.prompt.id}: the reference has {len(seq.reference)} "
                "tokens, too few to score the last rounds exactly (the completion source "
                "stopped early); τ of this prompt may be underestimated"
            )
        else:
            continue
        progress.warn(warnings[-1])


def _throughput(blocks: int, seconds: float) -> dict[str, Any]:
    return {
        "blocks": blocks,
        "seconds": round(seconds, 4),
        "blocks_per_s": round(blocks / seconds, 2) if seconds > 0 else None,
    }


def _per_prompt(
    sequences: list[Sequence], walks: list[PromptWalk], budgets: list[int]
) -> list[dict[str, Any]]:
    rows = []
    for seq, walked in zip(sequences, walks, strict=True):
        assert seq.span is not None, "references are made before the walks"
        rows.append(
            {
                "id": seq.prompt.id,
                "prompt_tokens": len(seq.prompt_ids),
                "completion_tokens": len(seq.completion),
                "stopped": seq.span.stop is not None and seq.span.stop < seq.span.limit,
                "reference_tokens": len(seq.reference),
                "rounds": len(walked.lengths),
                "tau": _mean(walked.lengths),
                "ddtree_tau": {str(b): _mean(walked.ddtree_lengths[b]) for b in budgets},
                "tau_capped": _mean(walked.capped_lengths),
                "cache": {"completion": seq.completion_hit, "hidden_states": seq.hidden_hit},
            }
        )
    return rows


def _mean(lengths: list[int]) -> float | None:
    return sum(lengths) / len(lengths) if lengths else None


def _comparison(metrics: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any] | None:
    if reference is None:
        return None
    theirs = reference["metrics"]
    return {
        name: (metrics[name] / theirs[name]) if metrics[name] and theirs[name] else None
        for name in ("tau_macro", "tau_pooled")
    }


def _options_record(options: EvalOptions) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()}


def human_summary(results: dict[str, Any]) -> str:
    """A few lines for people (stderr); the JSON holds everything."""
    metrics = results["metrics"]
    checkpoint = results["checkpoint"]
    lines = [
        f"Checkpoint {checkpoint['path']} (step {checkpoint['step']}, "
        f"{checkpoint['size_bytes']} bytes, sha256 {checkpoint['sha256'][:12]}…)",
        f"Target {results['target']['name']} ({results['target']['family']}), "
        f"{results['prompts']['count']} prompts, block size {metrics['block_size']}",
        _tau_line("τ", metrics),
        f"  (τ as z-lab's live loop counts it, last round uncapped; capped at the completion "
        f"end as before: macro {_fmt(metrics['capped']['tau_macro'])}, "
        f"pooled {_fmt(metrics['capped']['tau_pooled'])})",
    ]
    for budget, tree in metrics["ddtree"].items():
        lines.append(
            f"  DDTree-{budget}: τ macro {_fmt(tree['tau_macro'])}, "
            f"pooled {_fmt(tree['tau_pooled'])}"
        )
    accept = ", ".join(
        f"{row['position']}:{_fmt(row['conditional'], 2)}" for row in metrics["per_position"][:8]
    )
    lines.append(f"  acceptance by position (conditional): {accept}")
    if results["reference"]:
        lines.append(_tau_line("reference τ", results["reference"]["metrics"]))
        ratio = results["comparison"]["tau_macro"]
        lines.append(f"  τ macro ratio (drafter / reference): {_fmt(ratio)}")
    throughput = results["throughput"]
    lines.append(
        f"Drafter: {throughput['blocks']} blocks in {throughput['seconds']} s "
        f"({throughput['blocks_per_s']} blocks/s, {results['host']['torch_threads']} threads); "
        f"total {results['timings_s']['total']:.1f} s"
    )
    lines.extend(f"WARNING: {w}" for w in results["warnings"])
    return "\n".join(lines)


def _tau_line(label: str, metrics: dict[str, Any]) -> str:
    return (
        f"{label}: macro {_fmt(metrics['tau_macro'])}, pooled {_fmt(metrics['tau_pooled'])} "
        f"over {metrics['rounds']} rounds ({metrics['committed_tokens']} tokens)"
    )


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"
