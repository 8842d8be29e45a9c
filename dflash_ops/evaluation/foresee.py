"""Before a run starts: will its numbers be comparable with the results already pulled?

The comparability key (dflash_eval.contract.reading.comparability_key) is read from results, after
the run. Most of it follows from the run's options, known before: the harness's own parser reads
the run's harness argv (its defaults included), the prompts are hashed as the harness hashes
them, and the numerics version is that of the harness this checkout deploys. What only the
eval host can tell (the target's fingerprint, the checkpoint's block size, a dtype left to
`auto`) is left out: the warning names only what certainly differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflash_eval.contract.parser import build_parser
from dflash_eval.contract.prompts import builtin_prompts, prompts_hash, read_prompts_jsonl
from dflash_eval.contract.version import NUMERICS_VERSION, compared_numerics

from dflash_ops.evaluation.groups import RunGroup, differing, group_runs
from dflash_ops.evaluation.request import EvalRequest
from dflash_ops.evaluation.results import RunResult, load_runs


def expected_key(request: EvalRequest, from_sglang: bool = False) -> dict[str, Any]:
    """The parts of the run's comparability key that its options decide (`from_sglang`: its
    completions come from an SGLang server: request.sglang_url)."""
    placeholders = ["--checkpoint", "-", "--target", "-", "--out", "-"]
    args = build_parser().parse_args(["eval", *placeholders, *request.harness_args])
    key: dict[str, Any] = {
        "max new tokens": args.max_new_tokens,
        "max blocks": args.max_blocks,
        "thinking": args.thinking,
        "numerics": compared_numerics(NUMERICS_VERSION, sampled=bool(args.temperature)),
        # as reading.sampling_settings reads it: None at T = 0
        "sampling": (args.temperature, args.top_p, args.top_k) if args.temperature else None,
    }
    if request.features is None:  # a feature set brings its own prompts and completions
        local = "local-sampled" if args.temperature else "local-greedy"
        key["completions"] = "sglang" if from_sglang else local
        key["prompts"] = prompts_sha256(request.prompts, args.num_prompts)
    if args.block_size is not None:
        key["block size"] = args.block_size
    if args.dtype is not None:
        key["drafter dtype"] = args.dtype
    if args.target_dtype not in (None, "auto"):
        key["target dtype"] = args.target_dtype
    return key


def prompts_sha256(path: Path | None, count: int | None) -> str:
    """The prompts' sha256 as the harness records it (read and hashed by its own code)."""
    prompts = read_prompts_jsonl(path) if path else builtin_prompts()
    return prompts_hash(prompts[:count] if count else prompts)


def comparability_warning(
    results_root: Path, request: EvalRequest, from_sglang: bool = False
) -> str | None:
    """What sets the run apart from the largest comparability group of the pulled results,
    and which group it joins instead (or that it stands apart from all of them); None:
    nothing that can be told before it runs, or no results yet."""
    pulled = [run for run in load_runs(results_root) if run.results is not None]
    if not pulled:
        return None
    found = group_runs(pulled, RunResult.key, lambda run: run.run.get("started") or 0)
    expected = expected_key(request, from_sglang)
    names = _differing(expected, found[0])
    if not names:
        return None
    details = "; ".join(_difference(name, expected[name], found[0]) for name in names)
    return (
        f"this run will not be comparable with the {len(found[0].rows)} pulled run(s) of "
        f"comparability group 1 (key {found[0].id}: {details}); {_joins(expected, found)}"
    )


def _differing(expected: dict[str, Any], group: RunGroup[RunResult]) -> list[str]:
    """The names of `expected` (a partial key) whose values differ from `group`'s."""
    return differing(expected, {name: group.key.get(name) for name in expected})


def _joins(expected: dict[str, Any], found: list[RunGroup[RunResult]]) -> str:
    """Which pulled group the run will join, in what can be told before it runs, or why it
    will stand apart (what no pulled run shares with it)."""
    joined = [group for group in found[1:] if not _differing(expected, group)]
    if joined:
        group = joined[0]
        steps = ", ".join(str(step) for step in sorted({r.step for r in group.rows}))
        others = f"; {len(joined) - 1} other group(s) match too" if len(joined) > 1 else ""
        return (
            f"it joins comparability group {group.number} (key {group.id}, "
            f"{len(group.rows)} run(s), step(s) {steps}) as far as its options tell: the "
            f"target and the checkpoint's block size are known once it runs{others}"
        )
    unmatched = [name for name in expected if all(name in _differing(expected, g) for g in found)]
    shared = f"its {', '.join(unmatched)}" if unmatched else "all of its settings together"
    return f"it will stand apart, a new comparability group: no pulled run has {shared}"


def _difference(name: str, value: Any, group: RunGroup[RunResult]) -> str:
    theirs = group.key.get(name)
    if name == "prompts":
        count = group.rows[0].done["prompts"]["count"]
        return f"prompts sha256 {value[:12]}… vs {theirs[:12]}… ({count} prompts)"
    if name == "numerics":
        return (
            f"numerics version {value} vs {theirs} (the harness computes its numbers differently)"
        )
    if name == "sampling":
        return f"sampling {_sampling(value)} vs {_sampling(theirs)}"
    return f"{name} {value} vs {theirs}"


def _sampling(settings: Any) -> str:
    """(temperature, top_p, top_k) as people read it; None is greedy."""
    if settings is None:
        return "greedy (T 0)"
    temperature, top_p, top_k = settings
    return f"T {temperature:g}, top-p {top_p:g}, top-k {top_k}"
