"""Results shaped as the harness writes them (schema.Results), for tests of their readers."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from dflash_eval.contract.prompts import builtin_prompts, prompts_hash
from dflash_eval.contract.schema import KIND, SCHEMA_VERSION, Results
from dflash_eval.contract.schema_metrics import Metrics, TauBlock
from dflash_eval.contract.version import NUMERICS_VERSION

from dflash_ops.evaluation import results

# Keys that results written earlier under SCHEMA_VERSION 2 lack (the `total=False` parts of
# the types): such a file must still read.
LATER_KEYS = {
    "results": ("features", "by_dataset"),
    "checkpoint": ("sha256_source", "renamed_parameters", "pickle", "training_run"),
    "drafter": ("settings", "provenance", "accepted_defaults", "profile"),
    "prompts": ("thinking", "template_reads_thinking", "datasets"),
}
# Keys schema 3 added, which a schema-2 file (still read) lacks.
SCHEMA_3_KEYS = {
    "drafter": ("attention", "accepted_config_keys"),
    "metrics": ("conventions",),
}


def _tau(macro: float, pooled: float) -> TauBlock:
    return TauBlock(tau_macro=macro, tau_pooled=pooled, rounds=8, committed_tokens=10)


def _metrics(budgets: tuple[str, ...]) -> Metrics:
    return Metrics(
        block_size=4,
        tau_convention="zlab-live-loop",
        **_tau(1.5, 1.25),
        histogram={"1": 4, "2": 2, "3": 0, "4": 2},
        per_position=[
            {"position": k, "conditional": rate, "unconditional": rate, **counts}
            for k, rate, counts in (
                (1, 0.5, {"conditional_rounds": 8, "rounds": 8}),
                (2, 0.25, {"conditional_rounds": 4, "rounds": 8}),
                (3, None, {"conditional_rounds": 0, "rounds": 8}),
            )
        ],
        ddtree={b: _tau(1.75, 1.5) for b in budgets},
        conventions={"zlab-live-loop": "7d2ea1e9828b", "zlab-07ebd93": "07ebd93db9f4"},
        capped={
            "tau_convention": "zlab-07ebd93",
            **_tau(1.5, 1.25),
            "ddtree": {b: _tau(1.75, 1.5) for b in budgets},
        },
        incomplete_references=0,
    )


def _checkpoint() -> dict:
    return {
        "path": "/eval/step_2000/checkpoint.pt",
        "format": "training-checkpoint",
        "size_bytes": 1234,
        "sha256": "ab" * 32,
        "files": [
            {"path": "/eval/step_2000/checkpoint.pt", "size_bytes": 1234, "sha256": "ab" * 32}
        ],
        "step": 2000,
        "step_source": "checkpoint 'step'",
        "stripped_prefix": "",
        "dropped_entries": [],
        "ignored_parameters": [],
    }


def _drafter() -> dict:
    return {
        "config": {"block_size": 4},
        "config_source": "checkpoint",
        "config_notes": [],
        "trained_block_size": 4,
        "eval_block_size": 4,
        "dtype": "float32",
        "parameters": 1000,
        "attention": [{"kind": "full_attention", "causal": False, "window": None}],
        "accepted_config_keys": {},
    }


def results_dict(*, reference: bool = False, budgets: tuple[str, ...] = ("4", "8")) -> Results:
    """A complete results dict with round numbers, as the harness writes it."""
    metrics, checkpoint, drafter = _metrics(budgets), _checkpoint(), _drafter()
    return Results(
        schema_version=SCHEMA_VERSION,
        kind=KIND,
        created_at="2026-12-01T00:00:00+00:00",
        checkpoint=checkpoint,
        drafter={**drafter, "settings": {"dtype": "float32"}},
        target={
            "path": "/models/tiny",
            "name": "tiny",
            "family": "qwen3",
            "dtype": "float32",
            "num_layers": 4,
            "hidden_size": 64,
            "vocab_size": 256,
            "fingerprint": "f" * 64,
            "files": {},
        },
        prompts={
            "source": "builtin",
            "count": 2,
            "sha256": "p" * 64,
            "chat_template": True,
            "max_new_tokens": 24,
            "stop_token_ids": [0],
        },
        completions={"source": "local-greedy", "sglang_url": None, "extra_tokens": 4},
        harness={"content_sha256": "h" * 64, "predictor": "batched"},
        libraries={"python": "3.11.0", "torch": None},
        host={
            "hostname": "eval",
            "platform": "Linux",
            "machine": "x86_64",
            "cpu_count": 2,
            "torch_threads": 1,
            "python_executable": "/usr/bin/python3",
        },
        options={"max_blocks": None},
        timings_s={"total": 3.25},
        throughput={"blocks": 8, "seconds": 0.5, "blocks_per_s": 16.0},
        metrics=metrics,
        per_prompt=[],
        samples=[],
        reference={
            "checkpoint": copy.deepcopy(checkpoint),
            "drafter": drafter,
            "metrics": {**copy.deepcopy(metrics), "tau_macro": 3.0},
            "throughput": {"blocks": 8, "seconds": 0.5, "blocks_per_s": 16.0},
            "samples": [],
        }
        if reference
        else None,
        comparison={"tau_macro": 0.5, "tau_pooled": 1.0} if reference else None,
        warnings=["block size 4 differs from the trained 8"],
    )


def sampled_results_dict(temperature: float = 0.7, seed: int = 0) -> Results:
    """A complete T > 0 results dict: expected (float) counts, no DDTree, the sampling block."""
    results = results_dict(budgets=())
    metrics = results["metrics"]
    metrics.update(rounds=7.5, committed_tokens=10.25, histogram={"1": 3.5, "2": 4.0})
    metrics["capped"].update(rounds=7.25, committed_tokens=9.5)
    metrics["per_position"][0].update(conditional_rounds=7.5, rounds=7.5)
    interval = {"value": 1.37, "low": 1.35, "high": 1.39}
    metrics["sampling"] = {
        "temperature": temperature,
        "top_p": 0.95,
        "top_k": 0,
        "seed": seed,
        "samples": 200,
        "processing": "temperature, then top-k, then top-p (as z-lab's _sampling_probs)",
        "reference": "z-lab/dflash 10129599dffb338ff38cfd235a53ca6d3667b4dd",
        "estimator": "exact expectation given each prompt's sampled path",
        "ddtree": "not evaluated at T > 0",
        "monte_carlo": {
            "samples": 200,
            "level": 0.95,
            "method": "normal: mean ± z·sd/√samples",
            "tau_macro": interval,
            "tau_pooled": None,
        },
    }
    results["completions"]["source"] = "local-sampled"
    return results


def pulled(root: Path, runs: dict[str, dict]) -> list[results.RunResult]:
    """`runs` (run id → results) written as pulled runs of host `eval` under `root`, loaded."""
    for number, (run_id, made) in enumerate(runs.items()):
        directory = root / run_id
        directory.mkdir(parents=True)
        run = {"run_id": run_id, "host": "eval", "state": "succeeded", "started": number}
        (directory / "run.json").write_text(json.dumps(run))
        (directory / "results.json").write_text(json.dumps(made))
    return results.load_runs(root)


def comparable_results() -> Results:
    """Results whose comparability key is what a default run of this checkout would record
    (as far as its options tell: foresee.expected_key)."""
    outcome = results_dict()
    outcome["prompts"]["sha256"] = prompts_hash(builtin_prompts())
    outcome["prompts"]["max_new_tokens"] = 256
    outcome["options"] = {"max_blocks": None, "thinking": False}
    outcome["harness"]["numerics_version"] = NUMERICS_VERSION
    outcome["completions"]["source"] = "local-greedy"
    return outcome
