"""Results shaped as the harness writes them (schema.Results), for tests of their readers."""

from __future__ import annotations

import copy

from dflash_eval.schema import KIND, SCHEMA_VERSION, Results
from dflash_eval.schema_metrics import Metrics, TauBlock

# Keys that results written earlier under SCHEMA_VERSION 2 lack (the `total=False` parts of
# the types): such a file must still read.
LATER_KEYS = {
    "results": ("features", "by_dataset"),
    "checkpoint": ("sha256_source", "renamed_parameters", "pickle", "training_run"),
    "drafter": ("settings", "provenance", "accepted_defaults", "profile"),
    "prompts": ("thinking", "template_reads_thinking", "datasets"),
}


def _tau(macro: float, pooled: float) -> TauBlock:
    return TauBlock(tau_macro=macro, tau_pooled=pooled, rounds=8, committed_tokens=10)


def results_dict(*, reference: bool = False, budgets: tuple[str, ...] = ("4", "8")) -> Results:
    """A complete results dict with round numbers, as the harness writes it."""
    metrics = Metrics(
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
        capped={**_tau(1.5, 1.25), "ddtree": {b: _tau(1.75, 1.5) for b in budgets}},
        incomplete_references=0,
    )
    checkpoint = {
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
    drafter = {
        "config": {"block_size": 4},
        "config_source": "checkpoint",
        "config_notes": [],
        "trained_block_size": 4,
        "eval_block_size": 4,
        "dtype": "float32",
        "parameters": 1000,
    }
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
