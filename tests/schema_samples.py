"""Results dicts shaped as the harness writes them, for tests of their readers."""

from __future__ import annotations

from dflash_eval import schema


def results_dict(*, reference: bool = False, budgets: tuple[str, ...] = ("4", "8")) -> dict:
    """A results dict shaped as the harness writes it (only the keys the readers use)."""
    metrics = {
        schema.BLOCK_SIZE: 4,
        schema.TAU_MACRO: 1.5,
        schema.TAU_POOLED: 1.25,
        schema.TAU_CONVENTION: "zlab-live-loop",
        schema.ROUNDS: 8,
        schema.COMMITTED_TOKENS: 10,
        schema.PER_POSITION: [
            {schema.POSITION: 1, schema.CONDITIONAL: 0.5},
            {schema.POSITION: 2, schema.CONDITIONAL: 0.25},
            {schema.POSITION: 3, schema.CONDITIONAL: None},
        ],
        schema.DDTREE: {b: {schema.TAU_MACRO: 1.75, schema.TAU_POOLED: 1.5} for b in budgets},
    }
    return {
        schema.KIND_KEY: schema.KIND,
        schema.SCHEMA_VERSION_KEY: schema.SCHEMA_VERSION,
        schema.CHECKPOINT: {
            schema.PATH: "/eval/step_2000/checkpoint.pt",
            schema.SIZE_BYTES: 1234,
            schema.SHA256: "ab" * 32,
            schema.STEP: 2000,
        },
        schema.TARGET: {
            schema.TARGET_NAME: "tiny",
            schema.TARGET_FAMILY: "qwen3",
            schema.TARGET_FINGERPRINT: "f" * 64,
            "dtype": "float32",
        },
        schema.DRAFTER: {schema.SETTINGS: {"dtype": "float32"}},
        schema.OPTIONS: {"max_blocks": None},
        schema.PROMPTS: {
            schema.PROMPT_COUNT: 2,
            schema.PROMPTS_SHA256: "p" * 64,
            schema.MAX_NEW_TOKENS: 24,
        },
        schema.COMPLETIONS: {schema.COMPLETIONS_SOURCE: "local-greedy"},
        schema.HARNESS: {schema.HARNESS_SHA256: "h" * 64},
        schema.HOST: {schema.TORCH_THREADS: 1},
        schema.TIMINGS: {schema.TOTAL_SECONDS: 3.25},
        schema.THROUGHPUT: {schema.BLOCKS: 8, schema.SECONDS: 0.5, schema.BLOCKS_PER_S: 16.0},
        schema.METRICS: metrics,
        schema.REFERENCE: {schema.METRICS: {**metrics, schema.TAU_MACRO: 3.0}}
        if reference
        else None,
        schema.COMPARISON: {schema.TAU_MACRO: 0.5} if reference else None,
        schema.WARNINGS: ["block size 4 differs from the trained 8"],
    }
