"""`python -m dflash_eval plan …`: what an `eval` with the same flags would find and do,
without doing it and without writing anything.

It reads what `eval` reads before the heavy work (the target's config, tokenizer and
safetensors headers, the drafter checkpoint's settings when it is there, the prompts, the
cache entries' keys) and answers: which completions and hidden states are cached (the same
keys `eval` looks up: reference/cache_keys.py), what would be computed, whether the target's body
would load and how much memory that takes in the dtype `eval` would choose against what the host
has, and a time estimate (estimate.py). Nothing is created: no cache entry, no output file,
no directory; missing inputs are reported, not made.

Without a staged checkpoint the drafter's block size and target layers (which every cache
key needs) come from the command line or the profile; without those they are "unknown until
staged" and so are the cache counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.prompts import Prompt
from dflash_eval.contract.urls import redact_url
from dflash_eval.drafter.fit import require_context
from dflash_eval.plan import estimate
from dflash_eval.plan.cache_count import CacheCount, count_cache
from dflash_eval.plan.drafter import DrafterFacts, drafter_facts, reference_facts
from dflash_eval.plan.inputs import is_memory_file
from dflash_eval.reference.sglang_server import check_serves
from dflash_eval.run.options import EvalOptions
from dflash_eval.run.prepared import prepare
from dflash_eval.run.results import staged_sha256
from dflash_eval.run.threads import host_cores
from dflash_eval.target.config import TargetConfig, TargetShape, read_target_config
from dflash_eval.target.device import resolve_device_without_torch
from dflash_eval.target.dtype import (
    BYTES_PER_ELEMENT,
    FLOAT32_MARGIN,
    DtypeChoice,
    choose_target_dtype,
    parse_meminfo,
)
from dflash_eval.target.files import text_tensors, weight_bytes


@dataclass(frozen=True)
class HostFacts:
    """What the plan needs to know about the machine (read from /proc unless given)."""

    memory_available: int | None
    cpu: estimate.CpuInfo
    cores: int  # physical cores this process may run on (run.threads)

    @classmethod
    def read(cls) -> HostFacts:
        def text(path: str) -> str:
            try:
                return Path(path).read_text()
            except OSError:
                return ""

        return cls(
            parse_meminfo(text("/proc/meminfo")),
            estimate.parse_cpuinfo(text("/proc/cpuinfo")),
            host_cores(),
        )


def make_plan(options: EvalOptions, facts: HostFacts | None = None) -> dict[str, Any]:
    """The plan of `eval` with these options, as one JSON-ready dict."""
    facts = facts or HostFacts.read()
    _require_inputs(options)
    # The decisions `eval` makes, made by the same code (the device too: it is in every key).
    run = prepare(options, facts.cores, resolve_device_without_torch)
    options = run.options
    config = read_target_config(options.target)
    shape = config.shape
    saved = config.saved_dtype
    saved_bytes = weight_bytes(options.target)
    problems: list[str] = []
    try:
        choice: DtypeChoice | None = choose_target_dtype(
            options.target_dtype,
            saved,
            config,
            saved_bytes,
            facts.memory_available,
            options.device,
        )
    except HarnessError as refusal:
        choice = None
        problems.append(f"the run would refuse to start: {refusal}")
    drafter = drafter_facts(options, shape)
    reference = reference_facts(options, shape) if options.reference_drafter else None
    problems += drafter.problems + (reference.problems if reference else [])
    completions = completions_record(options, problems)
    cached = count_cache(run, config, choice, drafter, reference, completions)
    problems += context_problems(options, run.prompts, cached, [drafter, reference], config)
    target = _target_record(options, config, saved, saved_bytes, choice, facts, cached)
    machine = estimate.Machine(run.threads, facts.cpu.feature_class)
    phases = _phases(options, target, drafter, reference, cached, shape)
    return {
        "run": run.record(),
        "target": target,
        "drafter": drafter.record(),
        "reference_drafter": reference.record() if reference else None,
        "prompts": {"count": len(run.prompts), "source": prompts_source(options.prompts)},
        "cache": cached.record(),
        "completions": completions,
        "host": {
            "memory_available_bytes": facts.memory_available,
            "cpu": facts.cpu.record(),
            "cores": facts.cores,
            "threads": run.threads,
        },
        "estimate": estimate.estimate(machine, phases),
        "problems": problems,
    }


def context_problems(
    options: EvalOptions,
    prompts: list[Prompt],
    cached: CacheCount,
    drafters: list[DrafterFacts | None],
    config: TargetConfig,
) -> list[str]:
    """Each prompt whose completion would not fit the target's context, refused as the run
    refuses it (the prompt's length is known once it is encoded: first turns, and later ones
    whose earlier turns are cached)."""
    extra = max((d.block_size or 0 for d in drafters if d is not None), default=0)
    limit, problems = config.max_positions, []
    for prompt, counted in zip(prompts * cached.paths, cached.prompts, strict=True):
        if counted.prompt_tokens is None:
            continue
        try:
            require_context(prompt.id, counted.prompt_tokens, options.max_new_tokens, extra, limit)
        except HarnessError as refusal:
            problems.append(f"the run would refuse to start: {refusal}")
    return list(dict.fromkeys(problems))  # a first turn's paths share its length


def completions_record(options: EvalOptions, problems: list[str]) -> dict[str, Any]:
    """Where the completions would come from; an SGLang server is asked what it serves, as
    `eval` asks it before anything else (a refusal becomes a problem)."""
    if not options.sglang_url:
        return {"source": "local", "sglang_url": None}
    record: dict[str, Any] = {"source": "sglang", "sglang_url": redact_url(options.sglang_url)}
    try:
        served = check_serves(options.sglang_url, options.target)
    except HarnessError as refusal:
        problems.append(f"the run would refuse to start: {refusal}")
        return record
    return {**record, "sglang_model": served.model_path, "sglang_version": served.version}


def prompts_source(path: Path | None) -> str:
    if path is None:
        return "builtin"
    return "sent on stdin" if is_memory_file(path) else str(path)


def _require_inputs(options: EvalOptions) -> None:
    """The target must be there (the checkpoint may not be staged yet: that is planned)."""
    given = [("--target", options.target)]
    given += [("--prompts", options.prompts)] * bool(options.prompts)
    given += [("--drafter-profile", options.drafter_profile)] * bool(options.drafter_profile)
    given += [("--reference-drafter", options.reference_drafter)] * bool(options.reference_drafter)
    for flag, path in given:
        if not Path(path).exists():
            raise HarnessError(f"{flag} {path} does not exist on this host. Check the path.")


# --- memory and time ----------------------------------------------------------------------


def _target_record(
    options: EvalOptions,
    config: TargetConfig,
    saved: str,
    saved_bytes: int,
    choice: DtypeChoice | None,
    facts: HostFacts,
    cached: CacheCount,
) -> dict[str, Any]:
    dtype = choice.name if choice else saved
    in_memory = int(saved_bytes * BYTES_PER_ELEMENT[dtype] / BYTES_PER_ELEMENT.get(saved, 2))
    needed = int(in_memory * FLOAT32_MARGIN)
    body = body_loads(cached, options.sglang_url is not None)
    return {
        "path": str(options.target),
        "family": config.model_type,
        "parameters": header_parameters(Path(options.target)),
        "saved_dtype": saved,
        "saved_bytes": saved_bytes,
        "dtype": choice.name if choice else None,
        "dtype_source": choice.source if choice else "refused",
        "memory_needed_bytes": needed,
        "fits": None if facts.memory_available is None else facts.memory_available >= needed,
        "body_loads": body,
        "in_memory_bytes": in_memory,
    }


def body_loads(cached: CacheCount, sglang: bool) -> bool | None:
    """Whether `eval` would load the target's whole body (None: unknown until staged)."""
    if cached.unknown == cached.total and cached.total:
        return None
    missing_completions = cached.total - cached.completion_hits
    missing_hidden = cached.total - cached.hidden_hits
    fidelity = cached.features_record == "missing"
    return bool((missing_completions and not sglang) or missing_hidden or fidelity)


def header_parameters(path: Path) -> int:
    """Parameters of the text model, counted from the safetensors headers (no weight read)."""
    return sum(elements for elements, _ in text_tensors(path))


def _phases(
    options: EvalOptions,
    target: dict[str, Any],
    drafter: DrafterFacts,
    reference: DrafterFacts | None,
    cached: CacheCount,
    shape: TargetShape,
) -> dict[str, estimate.Phase]:
    """The work of each phase `eval` would run. Unknown lengths count as the longest
    possible: a completion is max_new_tokens plus a block past it."""
    dtype = target["dtype"] or target["saved_dtype"]
    params, in_memory = target["parameters"], target["in_memory_bytes"]
    new_tokens = options.max_new_tokens + (drafter.block_size or 0)
    head_bytes = 2 * shape.vocab_size * shape.hidden_size * BYTES_PER_ELEMENT[dtype]
    body = target["body_loads"] is not False
    layers = shape.num_layers
    phases = {
        "hash_checkpoint": estimate.Phase(disk_bytes=hashed_bytes(options)),
        "load_target": estimate.Phase(
            disk_bytes=in_memory if body else head_bytes,
            target_loads=1 if body else 0,
        ),
    }
    if not options.sglang_url:
        missing = [p for p in cached.prompts if p.reference_tokens is None]
        steps = len(missing) * new_tokens  # one decode step per token, each streams the weights
        prefill = sum(p.prompt_tokens or 0 for p in missing)
        phases["completions"] = estimate.Phase(
            2.0 * params * (prefill + steps),
            dtype,
            streamed_bytes=float(in_memory) * steps,
            decode_layer_steps=steps * layers,
            forward_layer_passes=len(missing) * layers,
        )
    uncached = [p for p in cached.prompts if not p.hidden_hit]
    forward = sum((p.prompt_tokens or 0) + (p.reference_tokens or new_tokens) for p in uncached)
    phases["hidden_states"] = estimate.Phase(
        2.0 * params * forward, dtype, forward_layer_passes=len(uncached) * layers
    )
    if cached.features_record == "missing" and cached.prompts:
        first = cached.prompts[0]
        tokens = (first.prompt_tokens or 0) + (first.reference_tokens or new_tokens)
        phases["fidelity"] = estimate.Phase(
            2.0 * params * tokens, "float32", forward_layer_passes=layers
        )
    for name, walker in (("drafter", drafter), ("reference_drafter", reference)):
        if walker is not None and walker.parameters is not None and walker.block_size:
            # Every anchor of the completion, a block each, through the layers and the LM head.
            per_token = 2.0 * (walker.parameters + shape.vocab_size * shape.hidden_size)
            anchors = cached.total * options.max_new_tokens
            phases[name] = estimate.Phase(
                per_token * anchors * walker.block_size,
                drafter.dtype,
                anchor_walks=anchors,
            )
    return phases


def hashed_bytes(options: EvalOptions) -> int:
    """Bytes of the checkpoint `eval` would hash: those without a staging manifest's sha256
    (all with --verify). A checkpoint not yet staged will have its manifest."""
    path = Path(options.checkpoint)
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    total = 0
    for file in (f for f in files if f.is_file() and not f.name.endswith(".manifest.json")):
        stat = file.stat()
        if options.verify or staged_sha256(file, stat.st_size, stat.st_mtime_ns) is None:
            total += stat.st_size
    return total


# --- the human summary ---------------------------------------------------------------


def summary_lines(plan: dict[str, Any]) -> list[str]:
    """The plan for people (the workstation draws its own view from the JSON)."""
    cache, target, guess = plan["cache"], plan["target"], plan["estimate"]
    drafter = plan["drafter"]
    lines = [
        f"drafter: block size {drafter['block_size']}, target layers "
        f"{drafter['target_layer_ids']} ({drafter['source']})",
        f"cache: completions {cache['completions']['hits']}/{cache['completions']['total']}, "
        f"hidden states {cache['hidden_states']['hits']}/{cache['hidden_states']['total']}"
        + (f", {cache['unknown']} unknown" if cache["unknown"] else "")
        + (f" ({cache['paths']} sampled paths per prompt)" if cache.get("paths", 1) > 1 else ""),
        f"target: {target['parameters']:,} parameters in {target['dtype'] or 'refused'} need "
        f"~{target['memory_needed_bytes'] / 2**30:.2f} GiB; body loads: {target['body_loads']}",
        f"estimate: ~{guess['seconds']:.0f} s on {guess['cores']} threads of "
        f"{plan['host']['cores']} physical cores ({guess['feature_class']})",
    ]
    return lines + [f"problem: {problem}" for problem in plan["problems"]]
