"""What `fab run-eval --dry-run` shows: one block per eval host (and step) with staging,
cache, compute, memory and the time estimate, lines a user can read at a glance."""

from __future__ import annotations

from dflash_ops.core.units import format_bytes
from dflash_ops.evaluation.plan import HostPlan
from dflash_ops.ui.console import shown


def plan_lines(plan: HostPlan) -> list[str]:
    """The plan of one host, as lines (rich markup)."""
    harness = plan.harness
    lines = [f"[bold]{plan.host}[/]: step {plan.step} (dry run: nothing staged, run or written)"]
    lines += _staging(plan)
    lines.append(f"  run: {_run(harness['run'])}")
    lines.append(f"  drafter: {_drafter(harness['drafter'])}")
    lines.append(f"  cache: {_cache(harness['cache'], harness['prompts']['count'])}")
    lines.append(f"  completions: {_completions(harness['completions'])}")
    lines.append(f"  compute: {_compute(harness)}")
    lines.append(f"  memory: {_memory(harness['target'], harness['host'])}")
    lines.append(f"  time: {_time(harness['estimate'], harness['host'])}")
    lines += [f"  note: {shown(note)}" for note in plan.notes]
    lines += [f"  [red]problem:[/] {shown(problem)}" for problem in harness["problems"]]
    return lines


def _staging(plan: HostPlan) -> list[str]:
    if plan.staged:
        return [f"  checkpoint: already staged at {plan.checkpoint}"]
    lines = [f"  checkpoint: not staged; would be copied to {plan.checkpoint}"]
    for hop in plan.hops:
        resume = f" (resume from {format_bytes(hop.offset)})" if hop.offset else ""
        lines.append(f"  staging: {format_bytes(hop.size - hop.offset)} to move{resume}")
        if hop.space is not None:
            lines.append(f"  disk: {hop.space.describe()}")
    return lines


def _completions(completions: dict) -> str:
    if completions["source"] == "local":
        return "the target's own, computed on the host (no SGLang server for this run)"
    if "sglang_model" not in completions:  # the server did not answer: a problem says why
        return f"SGLang at {completions['sglang_url']}"
    version = shown(completions["sglang_version"] or "version not given")
    model = shown(completions["sglang_model"])  # as the server names it
    return f"SGLang at {completions['sglang_url']}, serving {model} ({version})"


def _run(run: dict) -> str:
    """The decisions the run makes (the harness's prepared run): greedy or sampled, where."""
    on = f"on {run['device']}"
    if run["mode"] != "sampled":
        return f"greedy, {on}"
    sampling = run["sampling"]
    return (
        f"sampled at temperature {sampling['temperature']} (top-p {sampling['top_p']}, top-k "
        f"{sampling['top_k']}, seed {sampling['seed']}), {run['paths']} path(s) per prompt, {on}"
    )


def _drafter(drafter: dict) -> str:
    if drafter["block_size"] is None:
        return f"block size and target layers {drafter['source']}"
    return (
        f"block size {drafter['block_size']}, target layers {drafter['target_layer_ids']} "
        f"(from the {drafter['source']})"
    )


def _cache(cache: dict, prompts: int) -> str:
    if not cache["enabled"]:
        return "off (--no-cache): everything is computed"
    if cache["unknown"] == prompts:
        return f"{prompts} prompts; hits unknown (the keys need the drafter's settings and dtype)"
    completions, hidden = cache["completions"], cache["hidden_states"]
    text = (
        f"completions {completions['hits']}/{completions['total']} hit, hidden states "
        f"{hidden['hits']}/{hidden['total']} hit"
    )
    if cache["unknown"]:
        text += f", {cache['unknown']} unknown (later turns after uncached ones)"
    return text + f"; features record {cache['features_record']}"


def _compute(harness: dict) -> str:
    cache, target = harness["cache"], harness["target"]
    if cache["unknown"] == harness["prompts"]["count"]:
        return "unknown (the estimate assumes nothing is cached)"
    loads = {True: "loads the target's body", False: "reads only its embedding and head"}
    return (
        f"{cache['completions_to_compute']} completion(s), "
        f"{cache['hidden_states_to_compute']} hidden state(s); "
        + loads.get(target["body_loads"], "target load unknown until staged")
    )


def _memory(target: dict, host: dict) -> str:
    available = host["memory_available_bytes"]
    shown = "unknown" if available is None else format_bytes(available)
    verdict = {True: "fits", False: "[red]does NOT fit[/]", None: "?"}[target["fits"]]
    dtype = target["dtype"] or "refused"
    return (
        f"target {target['parameters']:,} parameters in {dtype} ({target['dtype_source']}) "
        f"needs ~{format_bytes(target['memory_needed_bytes'])}; {shown} available ({verdict})"
    )


def _time(estimate: dict, host: dict) -> str:
    """The estimate, with the thread count it assumes (the run's: --threads, the inventory's
    threads, else the host's physical cores less a reserve) beside the host's cores."""
    phases = ", ".join(f"{name} {seconds:.3g} s" for name, seconds in estimate["phases"].items())
    return (
        f"estimate ~{duration(estimate['seconds'])} on {estimate['cores']} threads "
        f"(of {host['cores']} physical cores; {estimate['feature_class']}): {phases}"
    )


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
