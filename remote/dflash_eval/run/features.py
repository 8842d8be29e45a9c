"""`python -m dflash_eval features`: compute a feature set (reference/feature_set.py) for later
evals.

The same phases as an eval's target side (reference/pipeline.py), with the same dtype choice and
fidelity guard (target/features.py), but no drafter: the layers and the block size are given, so
one set serves every drafter that reads a subset of those layers with a block no larger.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dflash_eval.contract import options as run_options
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.options import default
from dflash_eval.contract.progress import Progress, Timer
from dflash_eval.contract.prompts import Prompt, prompts_hash
from dflash_eval.reference import feature_set, feature_size, pipeline
from dflash_eval.reference.cache import DiskCache
from dflash_eval.reference.completions import SGLangClient, checked_client
from dflash_eval.reference.conversation import Conversations, template_reads_thinking
from dflash_eval.reference.feature_record import features_record
from dflash_eval.run.inputs import require_writable
from dflash_eval.run.prepared import load_prompts
from dflash_eval.run.results import library_versions, utc_now
from dflash_eval.run.threads import default_threads, host_cores
from dflash_eval.target.device import resolve_device
from dflash_eval.target.files import sha256_file
from dflash_eval.target.source import TargetSource, visible_gpus


@dataclass
class FeaturesOptions:
    target: Path
    out: Path  # SETDIR
    layers: list[int]
    block_size: int
    prompts: Path | None = None
    max_new_tokens: int = default("max_new_tokens")
    thinking: bool = default("thinking")
    target_dtype: str = default("target_dtype")
    sglang_url: str | None = None
    threads: int | None = None
    host_name: str | None = None  # the inventory's name for this host, recorded as `host`
    device: str = "auto"  # auto: CUDA when torch sees a GPU (a features host), else CPU
    check_space: bool = False  # only measure the set's bound against the free space
    shard_gpus: bool = False  # split the target over every visible GPU (target/placement.py)
    gpu_memory: int | None = None  # bytes of weights per GPU when sharding


def run_features(options: FeaturesOptions, progress: Progress) -> dict[str, Any]:
    """Build the set (or find it already built); the summary for the final event."""
    started = time.perf_counter()
    torch.set_num_threads(options.threads or default_threads(host_cores()))
    _check_options(options)
    prompts = load_prompts(options.prompts, None)
    setdir = Path(options.out)
    progress.event(
        "start",
        command="features",
        target=str(options.target),
        out=str(setdir),
        threads=torch.get_num_threads(),
    )
    timer, warnings = Timer(), []
    client = _sglang_client(options, progress)
    target = _load_target(options, timer, progress)
    _check_layers(options.layers, target.shape.num_layers)
    inputs = _inputs(options, prompts, target, client)
    if feature_set.is_complete_and_same(setdir, inputs):
        progress.say(f"{setdir} is already complete with these inputs: nothing to do")
        return _summary(setdir, feature_set.read_feature_set(setdir).manifest, noop=True)
    need = _space_need(options, prompts, target, inputs)
    progress.event("space", **need.record())
    if options.check_space:
        return {"set": setdir.name, "path": str(setdir), "space": need.record()}
    _require_space(need, setdir)
    partial = feature_set.open_partial(setdir, inputs, progress)
    lookup = pipeline.Lookup(
        DiskCache(partial),
        inputs["shared_key"],
        inputs["completions"]["source"],
        options.block_size,
        inputs["layer_ids"],
    )
    computed = _target_side(options, prompts, target, client, lookup, timer, progress, warnings)
    manifest = {
        **inputs,
        **_made(computed.record, options.host_name),
        "entries": computed.entries,
        "target_load": target.load_record(),
        "warnings": warnings,
        "timings": {name: round(s, 4) for name, s in timer.seconds.items()},
        "total_seconds": round(time.perf_counter() - started, 4),
        "created_at": utc_now(),
    }
    feature_set.complete(partial, setdir, manifest)
    progress.say(f"Feature set {setdir}: {computed.entries} prompts, layers {lookup.layer_ids}")
    return _summary(setdir, manifest, noop=False)


def _load_target(options: FeaturesOptions, timer: Timer, progress: Progress) -> TargetSource:
    """The target on the device asked for, or sharded over the visible GPUs."""
    with timer.phase("load_target"):
        device = resolve_device("cuda" if options.shard_gpus else options.device)
        shard = visible_gpus(options.gpu_memory) if options.shard_gpus else None
        return TargetSource(options.target, options.target_dtype, timer, progress, device, shard)


@dataclass(frozen=True)
class _Computed:
    entries: int  # the prompts whose states the set holds
    record: dict[str, Any]  # the features record: provenance and fidelity


def _target_side(
    options: FeaturesOptions,
    prompts: list[Prompt],
    target: TargetSource,
    client: SGLangClient | None,
    lookup: pipeline.Lookup,
    timer: Timer,
    progress: Progress,
    warnings: list[str],
) -> _Computed:
    """An eval's target side into the partial set behind `lookup`: the completions, every
    prompt's hidden states, and the features record measured on the first prompt."""
    if options.thinking and not template_reads_thinking(target.tokenizer):
        warnings.append("--thinking on, but the target's chat template has no thinking switch")
        progress.warn(warnings[-1])
    conversations = Conversations(target.tokenizer, options.thinking, options.max_new_tokens)
    sequences = [
        pipeline.Sequence(p, [] if p.follows else conversations.encode(p)) for p in prompts
    ]
    pipeline.target_side(
        sequences,
        lookup,
        target,
        client,
        options.max_new_tokens,
        conversations,
        progress,
        timer,
        keep_all=False,
    )
    with timer.phase("hidden_states"):  # the features record counts with the states
        record = features_record(
            target, sequences[0], lookup, progress, warnings, options.host_name
        )
    return _Computed(len(sequences), record)


def _sglang_client(options: FeaturesOptions, progress: Progress) -> SGLangClient | None:
    """Asked what it serves before the target loads (minutes for a real one), so that a
    server serving another model stops the run at once."""
    if not options.sglang_url:
        return None
    return checked_client(options.sglang_url, options.target, progress.say)


def _check_layers(layers: list[int], num_layers: int) -> None:
    too_deep = [i for i in layers if i >= num_layers]
    if too_deep:
        raise HarnessError(
            f"--layers {too_deep} do not exist: the target has {num_layers} layers "
            f"(0–{num_layers - 1})."
        )


def _require_space(need: feature_size.SpaceNeed, setdir: Path) -> None:
    if not need.fits:
        raise HarnessError(
            f"Not enough free space for feature set {setdir}: it needs {need.describe()}, and "
            f"{need.path} has {need.free / 2**20:.1f} MiB free. Free space there (old sets: "
            "`fab prune --features`), or extract fewer prompts or fewer --max-new-tokens."
        )


def _made(record: dict[str, Any], host_name: str | None) -> dict[str, Any]:
    """The manifest's provenance (where and how the states were computed) and fidelity."""
    provenance = {key: value for key, value in record.items() if key != "fidelity"}
    provenance["host"] = host_name or socket.gethostname()
    return {"provenance": provenance, "fidelity": record["fidelity"]}


def _inputs(
    options: FeaturesOptions,
    prompts: list[Prompt],
    target: TargetSource,
    client: SGLangClient | None,
) -> dict[str, Any]:
    """The manifest fields that name what the set was made from (feature_set.INPUT_FIELDS),
    as JSON would read them back, so that a re-run compares them with the set's own."""
    if options.prompts:
        prompt_record = {"source": str(options.prompts), "sha256": sha256_file(options.prompts)}
    else:
        prompt_record = {"source": "builtin", "sha256": prompts_hash(prompts)}
    identity = target.identity
    inputs = {
        "format": feature_set.FORMAT,
        "shared_key": pipeline.shared_key(identity["fingerprint"], target, library_versions()),
        "target": {
            "fingerprint": identity["fingerprint"],
            "name": identity["name"],
            "content_fingerprint": feature_set.content_fingerprint(identity),
        },
        "layer_ids": sorted(set(options.layers)),
        "block_size": options.block_size,
        "max_new_tokens": options.max_new_tokens,
        "thinking": options.thinking,
        "prompts": {"count": len(prompts), **prompt_record},
        "completions": {"source": pipeline.completion_source(client)},
    }
    return json.loads(json.dumps(inputs))


def _space_need(
    options: FeaturesOptions,
    prompts: list[Prompt],
    target: TargetSource,
    inputs: dict[str, Any],
) -> feature_size.SpaceNeed:
    """The set's upper bound (reference/feature_size.py) against the free space where it goes."""
    bounds = feature_size.token_bounds(
        prompts, target.tokenizer, options.thinking, options.max_new_tokens, options.block_size
    )
    shape = feature_size.SetShape(
        layers=len(inputs["layer_ids"]),
        hidden_size=target.shape.hidden_size,
        dtype=target.dtype_choice.name,
        vocab_size=target.shape.vocab_size,
        shared_key=inputs["shared_key"],
        completion_source=inputs["completions"]["source"],
        stops=target.stops,
        max_new_tokens=options.max_new_tokens,
        block_size=options.block_size,
        layer_ids=inputs["layer_ids"],
    )
    setdir = Path(options.out)
    return feature_size.measure(setdir, feature_set.partial_path(setdir), bounds, shape)


def _summary(setdir: Path, manifest: dict[str, Any], noop: bool) -> dict[str, Any]:
    return {
        "set": setdir.name,
        "path": str(setdir),
        "noop": noop,
        "entries": manifest["entries"],
        "layer_ids": manifest["layer_ids"],
        "block_size": manifest["block_size"],
        "target_fingerprint": manifest["target"]["fingerprint"],
        "provenance": manifest["provenance"],
        "fidelity_status": manifest["fidelity"]["status"],
    }


def _check_options(options: FeaturesOptions) -> None:
    """Fail in a second, before the target loads."""
    for flag, path in [("--target", options.target), ("--prompts", options.prompts)]:
        if path is not None and not Path(path).exists():
            raise HarnessError(f"{flag} {path} does not exist on this host. Check the path.")
    if not options.layers or any(i < 0 for i in options.layers):
        raise HarnessError(f"--layers must list target layer ids ≥ 0, got {options.layers}.")
    run_options.check(options, ("max_new_tokens", "threads", "block_size", "gpu_memory"))
    if options.shard_gpus and options.device == "cpu":
        raise HarnessError(
            "--shard-gpus splits the target over GPUs, but --device cpu asks for the CPU: drop "
            "one (a features host with `gpus` in the inventory shards; leave --device out)."
        )
    require_writable(f"--out {options.out}", Path(options.out).parent)
