"""One evaluation run: load → completions → hidden states → drafter walks → results JSON.

Phases (each timed, each reporting progress events):
1. load the target and the drafter(s), checking that they fit each other;
2. reference completions g per prompt (cache, else local greedy or SGLang);
3. target hidden states over prompt + completion (cache, else one forward per prompt);
4. drafter predictions for the anchors of each completion (batched) and the acceptance walks.

Phases 2 and 3 are reference/pipeline.py, shared with `features`; with `--features SETDIR` their
entries come from a feature set (reference/feature_set.py) and are never computed here.

The reference of each prompt is its completion plus `block size` more greedy tokens, so
that the walk scores every round as z-lab's live loop counts it (walk/metrics.py). At T > 0 the
reference is sampled and the walks are expectations along it (walk/sampled.py). record.py
assembles the results from what the phases produced.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import torch

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.progress import Progress, Timer
from dflash_eval.contract.schema import Checkpoint, Results
from dflash_eval.drafter.config import DrafterConfig
from dflash_eval.drafter.health import NonFiniteLogits, non_finite_logits
from dflash_eval.drafter.loaders import LoadedDrafter
from dflash_eval.reference import pipeline
from dflash_eval.reference.cache import DiskCache
from dflash_eval.reference.cache_keys import LOCAL_SAMPLED
from dflash_eval.reference.completions import SGLangClient, checked_client
from dflash_eval.reference.conversation import Conversations, template_reads_thinking
from dflash_eval.reference.feature_record import features_record, report_fidelity
from dflash_eval.reference.feature_set import FeatureSet, read_feature_set
from dflash_eval.reference.sequence import Sequence
from dflash_eval.run import inputs, record
from dflash_eval.run.drafters import ddtree_budgets, load_drafters
from dflash_eval.run.options import EvalOptions
from dflash_eval.run.prepared import PreparedRun, prepare
from dflash_eval.run.record import DrafterRun
from dflash_eval.run.results import library_versions, write_results
from dflash_eval.run.threads import host_cores
from dflash_eval.target.device import resolve_device
from dflash_eval.target.model import DTYPES
from dflash_eval.target.source import TargetSource
from dflash_eval.walk.metrics import PromptWalk, summarize, walk_prompt
from dflash_eval.walk.predict import BorrowedHead, PerBlockPredictor, Predictor, SampledPredictor
from dflash_eval.walk.sampled import SampledWalk, summarize_sampled, walk_sequence
from dflash_eval.walk.samples import Decode, draft_sample, sampled_prompts, tokenizer_decoder
from dflash_eval.walk.sampling_settings import refuse_dflash2


def run_eval(options: EvalOptions, progress: Progress) -> Results:
    started = time.perf_counter()
    timer = Timer()
    inputs.check_paths(options)  # a missing input fails before anything is decided from it
    run = prepare(options, host_cores(), resolve_device)  # options checked before torch has any
    torch.set_num_threads(run.threads)
    options = run.options
    # A feature set is read first: its dtype is the run's, and a bad one fails in a second.
    features_set = read_feature_set(options.features) if options.features else None
    progress.event(
        "start",
        checkpoint=str(options.checkpoint),
        target=str(options.target),
        out=str(options.out),
        threads=run.threads,
    )
    warnings: list[str] = []
    client = _sglang_client(options, features_set, progress, warnings)  # checked before all

    with timer.phase("load_target"):
        # The model itself loads only if a completion or hidden state must be computed.
        target = TargetSource(
            options.target, _target_dtype(options, features_set), timer, progress, options.device
        )
    with timer.phase("load_drafter"):
        drafter, reference = load_drafters(options, target.shape, progress, warnings)
    dflash2 = [d.source.path for d in (drafter, reference) if d is not None and d.config.dflash2]
    refuse_dflash2(run.sampling, dflash2)
    run = run.with_ddtree(ddtree_budgets(options.ddtree, [drafter, reference]))
    options = run.options
    with timer.phase("hash"):
        drafter_identity = record.checkpoint_identity(
            drafter, options.step, options.verify, options.training_run
        )
        reference_identity = (
            record.checkpoint_identity(reference, None, options.verify) if reference else None
        )

    drafters = {"drafter": drafter.config}
    if reference is not None:
        drafters["reference drafter"] = reference.config
    parts = _target_side(run, features_set, target, client, drafters, warnings, progress, timer)
    borrowed = target.embedding_and_head()
    walked = _evaluate(drafter, drafter_identity, "drafter", parts, borrowed, progress, timer)
    ref_walked = (
        _evaluate(
            reference, reference_identity, "reference_drafter", parts, borrowed, progress, timer
        )
        if reference is not None and reference_identity is not None
        else None
    )
    results = record.results(parts, walked, ref_walked, timer, started)
    write_results(options.out, results)
    return results


def _target_side(
    run: PreparedRun,
    features_set: FeatureSet | None,
    target: TargetSource,
    client: SGLangClient | None,
    drafters: dict[str, DrafterConfig],
    warnings: list[str],
    progress: Progress,
    timer: Timer,
) -> record.RunParts:
    """Phases 2 and 3: each prompt's reference completion, then its hidden states (from the
    feature set, the cache, SGLang or the target), and the features record."""
    # Later turns of a conversation are encoded once the turn before has its completion;
    # at T > 0 each prompt has `paths` sequences, path by path (each path its own history).
    options = run.options
    conversations = Conversations(target.tokenizer, options.thinking, options.max_new_tokens)
    sequences = [
        Sequence(p, [] if p.follows else conversations.encode(p, path), path)
        for path in range(run.paths)
        for p in run.prompts
    ]
    if options.thinking and not template_reads_thinking(target.tokenizer):
        warnings.append("--thinking on, but the target's chat template has no thinking switch")
        progress.warn(warnings[-1])
    libraries = library_versions()
    target_match = (  # the set (if any) must serve this run exactly
        features_set.check_fits(target.identity, drafters, options.max_new_tokens, options.thinking)
        if features_set is not None
        else None
    )
    lookup = _lookup(options, features_set, drafters, target, libraries, client)
    if run.sampled:
        lookup.completion_source, lookup.sampling = LOCAL_SAMPLED, run.sampling
    pipeline.target_side(
        sequences,
        lookup,
        target,
        client,
        options.max_new_tokens,
        conversations,
        progress,
        timer,
    )
    with timer.phase("hidden_states"):  # the features record counts with the states
        if features_set is not None:
            features = {**features_set.features_record(), "target_match": target_match}
            report_fidelity(features, progress, warnings)
        else:
            features = features_record(target, sequences[0], lookup, progress, warnings)
    target.release_body()
    return record.RunParts(
        run,
        target,
        lookup,
        libraries,
        features,
        sequences,
        conversations,
        warnings,
    )


def _evaluate(
    loaded: LoadedDrafter,
    identity: Checkpoint,
    phase: str,
    parts: record.RunParts,
    borrowed: tuple[torch.Tensor, torch.Tensor],
    progress: Progress,
    timer: Timer,
) -> record.Evaluated:
    """Phase 4 for one drafter: its walks over every sequence, their summary, and loud
    warnings about prompts it could not score."""
    decode = tokenizer_decoder(parts.target.tokenizer)
    with timer.phase(phase):
        run = _walk_all(loaded, phase, parts.sequences, borrowed, parts.run, decode, progress)
    if parts.run.sampled:
        units = [(s.prompt.id, parts.conversations.first_turn(s.prompt)) for s in parts.sequences]
        metrics = summarize_sampled(run.walks, loaded.config.block_size, parts.run.sampling, units)
    else:
        metrics = summarize(run.walks, loaded.config.block_size, parts.options.ddtree)
    role = phase.replace("_", " ")
    _warn_about_walks(parts.sequences, run.walks, role, parts.warnings, progress)
    return record.Evaluated(loaded, identity, run, metrics)


def _target_dtype(options: EvalOptions, features_set: FeatureSet | None) -> str:
    """The feature set's dtype when there is one: the drafter reads the embedding and head
    in the dtype the features were computed in, as a run that computes them would."""
    if features_set is None:
        return options.target_dtype
    if options.target_dtype not in ("auto", features_set.dtype):
        raise HarnessError(
            f"--target-dtype {options.target_dtype}, but feature set {features_set.path} was "
            f"computed in {features_set.dtype}. Omit --target-dtype (the set's dtype is used), "
            "or extract a set in the dtype you want."
        )
    return features_set.dtype


def _sglang_client(
    options: EvalOptions,
    features_set: FeatureSet | None,
    progress: Progress,
    warnings: list[str],
) -> SGLangClient | None:
    """The SGLang server's client, once it has said that it serves the target."""
    if not options.sglang_url:
        return None
    if features_set is None:
        return checked_client(options.sglang_url, options.target, progress.say)
    warnings.append(
        f"--sglang-url ignored: the completions come from feature set {features_set.name} "
        f"({features_set.manifest['completions']['source']})"
    )
    progress.warn(warnings[-1])
    return None


def _lookup(
    options: EvalOptions,
    features_set: FeatureSet | None,
    drafters: dict[str, DrafterConfig],
    target: TargetSource,
    libraries: dict[str, Any],
    client: SGLangClient | None,
) -> pipeline.Lookup:
    """Entries from the feature set (read-only: a miss is an error), else from the cache,
    computing misses. The reference runs one block past the completion: the larger block
    when two drafters share it; the hidden states cover every layer either reads."""
    if features_set is not None:
        manifest = features_set.manifest
        return pipeline.Lookup(
            features_set.cache(),
            manifest["shared_key"],
            manifest["completions"]["source"],
            manifest["block_size"],
            manifest["layer_ids"],
            missing=features_set.missing,
        )
    return pipeline.Lookup(
        DiskCache(options.cache_dir),
        pipeline.shared_key(target.identity["fingerprint"], target, libraries),
        pipeline.completion_source(client),
        max(config.block_size for config in drafters.values()),
        sorted(set().union(*(config.target_layer_ids for config in drafters.values()))),
        served=client.served.record() if client and client.served else None,
    )


def _walk_all(
    loaded: LoadedDrafter,
    phase: str,
    sequences: list[Sequence],
    borrowed: tuple[torch.Tensor, torch.Tensor],  # the target's embedding and LM head
    run: PreparedRun,
    decode: Decode,
    progress: Progress,
) -> DrafterRun:
    config = loaded.config
    dtype = DTYPES[loaded.dtype]
    device = run.options.device  # decided by prepare: never left unset
    head = BorrowedHead.from_target(*borrowed, config.mask_token_id, dtype, device)
    loaded.model.to(device)
    # Every tensor the predictors make (positions, masks, token ids) goes to `device` too.
    # Not on the CPU, where they are made anyway: the device context intercepts every torch
    # call in Python, which costs the small CPU ops of a walk.
    with nullcontext() if device == "cpu" else torch.device(device):
        return _walk_on(loaded, phase, sequences, head, run, decode, progress)


def _walk_on(
    loaded: LoadedDrafter,
    phase: str,
    sequences: list[Sequence],
    head: BorrowedHead,
    prepared: PreparedRun,
    decode: Decode,
    progress: Progress,
) -> DrafterRun:
    config, options = loaded.config, prepared.options
    dtype = head.embed_weight.dtype
    top_k = max([1, *options.ddtree])
    predictor_class = PerBlockPredictor if options.per_block else Predictor
    predictor_class = SampledPredictor if prepared.sampled else predictor_class
    run = DrafterRun([], 0, 0.0, [])
    total = len(sequences)
    sampled = sampled_prompts([seq.prompt.dataset for seq in sequences])
    progress.progress(phase, 0, total)
    for done, seq in enumerate(sequences, start=1):
        span = seq.span
        assert span is not None, "references are made before the walks"
        features = torch.cat([seq.hidden[i] for i in config.target_layer_ids], dim=-1)
        predictor = predictor_class(
            loaded.model,
            head,
            seq.tokens,
            features.to(device=head.embed_weight.device, dtype=dtype),
            span.first_anchor,
            config.block_size,
            top_k,
            chunk=1 if options.per_block else options.chunk_anchors,
            last_anchor=span.limit - 1,  # no round starts at max_new_tokens or later
        )
        try:
            if isinstance(predictor, SampledPredictor):
                walked = None
                run.walks.append(
                    walk_sequence(predictor, seq, prepared.sampling, options.max_blocks)
                )
            else:
                walked = walk_prompt(
                    predictor,
                    seq.tokens,
                    span,
                    config.block_size,
                    options.ddtree,
                    options.max_blocks,
                )
                run.walks.append(walked)
        except NonFiniteLogits:
            raise non_finite_logits(seq.prompt.id, phase, features, head) from None
        if walked is not None and done - 1 in sampled:
            run.samples.append(
                draft_sample(
                    seq.prompt.id,
                    seq.prompt.dataset,
                    seq.tokens,
                    (span.first_anchor, span.end),
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
    walks: list[PromptWalk] | list[SampledWalk],
    role: str,
    warnings: list[str],
    progress: Progress,
) -> None:
    for seq, walked in zip(sequences, walks, strict=True):
        walked_any = (
            walked.main.tau is not None if isinstance(walked, SampledWalk) else walked.lengths
        )
        if not walked_any:
            warnings.append(
                f"{role}, prompt {seq.prompt.id}{_path_text(seq)}: no rounds (the reference has "
                f"{len(seq.reference)} tokens)"
            )
        elif not walked.reference_complete:
            warnings.append(
                f"{role}, prompt {seq.prompt.id}{_path_text(seq)}: the reference has "
                f"{len(seq.reference)} "
                "tokens, too few to score the last rounds exactly (the completion source "
                "stopped early); τ of this prompt may be underestimated"
            )
        else:
            continue
        progress.warn(warnings[-1])


def _path_text(seq: Sequence) -> str:
    return f" (sampled path {seq.path + 1})" if seq.path else ""
