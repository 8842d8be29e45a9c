"""The one human summary of a Results (schema.py), and the headline the harness's `done`
event carries. The harness prints the summary to its log, the workstation after pulling a
run; the JSON holds everything else. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dflash_eval.contract.reading import (
    comparability_id,
    conditional_by_position,
    format_interval,
    groups,
)
from dflash_eval.contract.schema import DRAFTER_SETTINGS, Drafter, Prompts, Results
from dflash_eval.contract.schema_metrics import PathsInterval

POSITIONS_SUMMARISED = 8  # per-position acceptance shown for the first positions only


def headline(results: Results) -> dict[str, Any]:
    """The key numbers of one results dict: the harness's `done` event carries them."""
    metrics, reference = results["metrics"], results["reference"]
    return {
        "step": results["checkpoint"]["step"],
        "tau_macro": metrics["tau_macro"],
        "tau_pooled": metrics["tau_pooled"],
        "rounds": metrics["rounds"],
        "ddtree": {b: tau["tau_macro"] for b, tau in metrics["ddtree"].items()},
        "reference_tau_macro": reference["metrics"]["tau_macro"] if reference else None,
        "seconds": results["timings_s"]["total"],
    }


def summary_lines(results: Results) -> list[str]:
    """The human summary of one results dict."""
    metrics = results["metrics"]
    lines = [
        f"step {results['checkpoint']['step']}  τ macro {_number(metrics['tau_macro'])}  "
        f"τ pooled {_number(metrics['tau_pooled'])}  ({_count(metrics['rounds'])} rounds, "
        f"{_count(metrics['committed_tokens'])} tokens, block size {metrics['block_size']})"
    ]
    sampling = metrics.get("sampling")
    if sampling:
        mc = sampling["monte_carlo"]
        lines.append(
            f"  sampled at T {sampling['temperature']:g} (top-p {sampling['top_p']:g}, top-k "
            f"{sampling['top_k']}, seed {sampling['seed']}): expectations given the sampled "
            f"paths; Monte Carlo τ macro {format_interval(mc['tau_macro'])} "
            f"({mc['samples']} walks per prompt)"
        )
        lines += _paths_interval_lines(sampling.get("interval"))
    capped = metrics["capped"]
    # Schema 2's `capped` (no tau_convention) capped whole blocks at the completion end.
    other = (
        "z-lab's 07ebd93 loop (last block shortened, capped at the completion end)"
        if capped.get("tau_convention")
        else "capped at the completion end"
    )
    lines.append(
        f"  τ as z-lab's live loop counts it (last round uncapped); {other}: "
        f"macro {_number(capped['tau_macro'])}, pooled {_number(capped['tau_pooled'])}"
    )
    if metrics["ddtree"]:
        lines.append(
            "DDTree τ: "
            + ", ".join(
                f"b={b}: {_number(tau['tau_macro'])}" for b, tau in metrics["ddtree"].items()
            )
        )
    accepted = list(conditional_by_position(metrics).items())[:POSITIONS_SUMMARISED]
    lines.append(
        "acceptance by position (conditional): "
        + ", ".join(f"{position}:{_number(rate, 2)}" for position, rate in accepted)
    )
    lines += _interval_lines(results)
    reference, ratio = results["reference"], (results["comparison"] or {}).get("tau_macro")
    if reference:
        lines.append(
            f"reference drafter τ macro {_number(reference['metrics']['tau_macro'])}"
            + (f" (this run: {ratio:.2f}× of it)" if ratio else "")
        )
    if results["drafter"].get("provenance"):
        lines.append(settings_line(results["drafter"]))
    lines += _provenance_lines(results)
    lines += sample_lines(results, prompts=1, rounds=2)
    lines += [f"WARNING: {warning}" for warning in results["warnings"]]
    return lines


def sample_lines(
    results: Results, prompts: int | None = None, rounds: int | None = None
) -> list[str]:
    """The decoded drafts next to the target's text, so that garbage is seen at a glance."""
    return [
        f"sample {sample['id']} @{shown['position']} (accepted {shown['accepted']}): "
        f"target {shown['target']!r}  draft {shown['draft']!r}"
        for sample in results["samples"][:prompts]
        for shown in sample["rounds"][:rounds]
    ]


def _paths_interval_lines(interval: PathsInterval | None) -> list[str]:
    """The T > 0 interval (absent in records before --paths), and its warning."""
    if not interval:
        return []
    return [
        f"  {interval['level']:.0%} interval for the live loop's τ (Student-t over "
        f"{interval['units']} prompt means, {interval['paths']} sampled paths each): "
        f"τ macro {format_interval(interval['tau_macro'])}, "
        f"τ pooled {format_interval(interval['tau_pooled'])}"
    ] + ([f"  WARNING: {interval['warning']}"] if interval["warning"] else [])


def _interval_lines(results: Results) -> list[str]:
    """τ with its confidence interval, overall and per named prompt set."""
    block = results.get("by_dataset")
    if not block:
        return []
    settings = block["bootstrap"]
    sampled = (results["metrics"].get("sampling") or {}).get("interval")
    lines = [
        f"{settings['level']:.0%} confidence intervals (bootstrap over "
        f"{settings['unit']}s, {settings['resamples']} resamples, seed {settings['seed']}"
        + ("; at T > 0 the t interval above is the live loop's" if sampled else "")
        + "):"
    ]
    for name, group in groups(results).items():
        budget = max(group["ddtree"], key=int, default=None)
        lines.append(
            f"  {name} ({group['prompts']} prompts): "
            f"τ macro {format_interval(group['tau_macro'])}, "
            f"τ pooled {format_interval(group['tau_pooled'])}"
            + (
                f", DDTree-{budget} τ {format_interval(group['ddtree'][budget]['tau_macro'])}"
                if budget
                else ""
            )
        )
    return lines


def _provenance_lines(results: Results) -> list[str]:
    """What was evaluated, on what, and how long it took."""
    checkpoint, target = results["checkpoint"], results["target"]
    throughput = results["throughput"]
    return [
        f"Checkpoint {checkpoint['path']} ({checkpoint['size_bytes']} bytes, "
        f"sha256 {checkpoint['sha256'][:12]}…)",
        f"Target {target['name']} ({target['family']}), "
        f"{results['prompts']['count']} prompts" + _prompt_sets_note(results["prompts"]),
        f"Comparability key {comparability_id(results)}: compared only with runs of this key",
        f"Drafter: {throughput['blocks']} blocks in {throughput['seconds']} s "
        f"({throughput['blocks_per_s']} blocks/s, {results['host']['torch_threads']} threads); "
        f"total {results['timings_s']['total']:.1f} s",
    ]


def _prompt_sets_note(prompts: Prompts) -> str:
    """' (gsm8k 20: openai/gsm8k@1a2b3c4d5e6f, …; thinking off)', or '' for plain prompts."""
    sets = prompts.get("datasets") or {}
    if not sets:
        return ""
    described = []
    for name, entry in sets.items():
        source = entry["source"] or {}
        origin = source.get("repo") or source.get("files") or "?"
        revision = source.get("revision")
        described.append(
            f"{name} {entry['count']}: {origin}" + (f"@{revision[:12]}" if revision else "")
        )
    return f" ({'; '.join(described)}; thinking {prompts.get('thinking', 'off')})"


def _count(value: float) -> str:
    """A count as it is at T = 0, an expected count (T > 0) to one decimal."""
    return str(value) if isinstance(value, int) else f"{value:.1f}"


def _number(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_setting(name: str, value: Any) -> str:
    """A setting's value as people read it (layer ids as a list, RoPE in one phrase)."""
    if isinstance(value, tuple):
        return str(list(value))
    if name == "rope" and isinstance(value, Mapping):
        extras = ", ".join(
            f"{k} {v}" for k, v in value.items() if k not in ("rope_type", "rope_theta")
        )
        theta = value.get("rope_theta")
        return f"{value.get('rope_type')} (θ {theta:g}{', ' + extras if extras else ''})"
    return str(value)


def settings_line(drafter: Drafter) -> str:
    """One line for the human summary, from a results JSON `drafter` block."""
    values, sources = drafter.get("settings") or {}, drafter.get("provenance") or {}
    accepted = drafter.get("accepted_defaults") or {}
    parts = []
    for name in DRAFTER_SETTINGS:
        if name not in sources:
            continue
        source = sources[name]
        if name in accepted:
            source += f", accepted by {accepted[name]}"
        parts.append(f"{name} {format_setting(name, _as_tuple(values.get(name)))} ({source})")
    return "Drafter settings: " + "; ".join(parts)


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
