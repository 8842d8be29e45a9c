"""Batched drafter passes vs straightforward per-block loops, on a small random model.

    .venv/bin/python benchmarks/harness.py [--threads 1,2] [--tokens 1024] [--prompts 1]

Three variants compute the same metrics (vanilla + DDTree walks) from the same random
context features: `batched` (the harness: chunks of consecutive anchors in one pass with a
block-structured mask), `per-block` (one forward per block, reusing the cached context
K/V) and `uncached` (one full forward per block, context K/V recomputed: what a naive
harness does). The script prints blocks/s of each, the ratios (target ≥ 5×), whether the
metrics are identical, and peak memory. Each variant runs in its own child process so that
its peak RSS (resource.getrusage ru_maxrss) is its own; "above setup" subtracts the
child's RSS once the model and inputs are built.

Every variant shares the rest of the harness: the LM head over every slot (the greedy
draft and the log-softmax normaliser need the full vocabulary), top-k only for the slots a
DDTree can reach, and the Python walk. On a model this small that shared work and the
layers' own FLOPs are most of the batched variant's time, and the per-block loops' extra
cost is per-operation overhead and small, cache-resident GEMMs (with several threads, also
OpenMP synchronisation per small op); the ratios depend on the thread count and on how busy
the machine is, so each thread count is measured separately, after an untimed warm-up. On
real sizes (H 4–5k, vocab 150–250k) a per-block loop re-reads every weight matrix per block,
which batching amortises.

With a random drafter nearly every draft is rejected (τ ≈ 1), so all variants visit the
same anchors. With a trained drafter the batched path computes every anchor while the walk
visits about 1/τ of them, so its wall-time advantage is the blocks/s ratio divided by τ.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote"))

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 256, 2, 4, 2, 64
BLOCK_SIZE, PROMPT_TOKENS = 16, 64
WARM_UP_TOKENS = PROMPT_TOKENS + 256
BUDGETS = [4, 8, 16, 32]
# per-block: one forward per block reusing the cached context K/V (same maths as batched);
# uncached: one full forward per block, context included (what a naive harness does).
VARIANTS = ("uncached", "per-block", "batched")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _current_rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / (1 << 20)


def _run_variant(
    variant: str, tokens_per_prompt: int, prompts: int, threads: int, vocab: int, queue
) -> None:
    import torch
    from dflash_eval.config import DrafterConfig
    from dflash_eval.metrics import summarize, walk_prompt
    from dflash_eval.model import DFlashDrafter
    from dflash_eval.predict import (
        BorrowedHead,
        PerBlockPredictor,
        Predictor,
        block_predictions,
    )

    class UncachedPerBlockPredictor(PerBlockPredictor):
        """What a naive harness does: the whole drafter forward per block, recomputing the
        fused context and its K/V every time."""

        @torch.inference_mode()
        def _predict(self, anchors: torch.Tensor) -> list:
            predictions = []
            for anchor in anchors.tolist():
                ctx = self.drafter.fuse_context(self._features[:anchor])
                embeds = self._block_embeds(torch.tensor([anchor]))[0]
                hidden = self.drafter.forward_uncached(ctx, embeds)
                predictions += block_predictions(hidden[None], self.head.head_weight, self.top_k)
            return predictions

    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    config = DrafterConfig(
        hidden_size=HIDDEN,
        intermediate_size=3 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        target_layer_ids=(1, 5),
        block_size=BLOCK_SIZE,
        mask_token_id=vocab - 1,
    )
    torch.manual_seed(0)
    drafter = DFlashDrafter(config).eval()
    head = BorrowedHead(
        torch.randn(vocab, HIDDEN, generator=generator),
        torch.randn(vocab, HIDDEN, generator=generator) * 0.05,
        config.mask_token_id,
    )
    length = PROMPT_TOKENS + tokens_per_prompt
    sequences = [
        (
            torch.randint(0, vocab - 1, (length,), generator=generator).tolist(),
            torch.randn(length, 2 * HIDDEN, generator=generator),
        )
        for _ in range(prompts)
    ]
    setup_rss = _current_rss_mib()
    predictor_class = {
        "batched": Predictor,
        "per-block": PerBlockPredictor,
        "uncached": UncachedPerBlockPredictor,
    }[variant]

    def walk_sequence(tokens: list[int], features: torch.Tensor):
        predictor = predictor_class(
            drafter,
            head,
            tokens,
            features,
            PROMPT_TOKENS,
            BLOCK_SIZE,
            max(BUDGETS),
            chunk=None if variant == "batched" else 1,
        )
        walked = walk_prompt(predictor, tokens, PROMPT_TOKENS, BLOCK_SIZE, BUDGETS)
        return walked, predictor.blocks_computed

    # Steady state, as over the many prompts of a real run: the first passes through the
    # kernels and the allocator are slow, so a short warm-up sequence goes untimed.
    tokens, features = sequences[0]
    walk_sequence(tokens[:WARM_UP_TOKENS], features[:WARM_UP_TOKENS])
    walks, blocks, started = [], 0, time.perf_counter()
    for tokens, features in sequences:
        walked, computed = walk_sequence(tokens, features)
        walks.append(walked)
        blocks += computed
    seconds = time.perf_counter() - started
    queue.put(
        {
            "variant": variant,
            "blocks": blocks,
            "seconds": seconds,
            "metrics": summarize(walks, BLOCK_SIZE, BUDGETS),
            "peak_rss_mib": _peak_rss_mib(),
            "setup_rss_mib": setup_rss,
        }
    )


def _in_child(variant: str, args: argparse.Namespace) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(
        target=_run_variant,
        args=(variant, args.tokens, args.prompts, args.threads, args.vocab, queue),
    )
    child.start()
    result = queue.get()
    child.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--tokens", type=int, default=1024, help="completion tokens per prompt")
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument(
        "--vocab",
        type=int,
        default=4096,
        help="LM head rows (default 4096: the head is then ~1/3 of a block's FLOPs, as in "
        "Qwen3-8B-DFlash; the whole vocabulary is computed for every slot in every variant)",
    )
    args = parser.parse_args()
    for threads in [int(t) for t in args.threads.split(",")]:
        args.threads = threads
        _compare(args)


def _compare(args: argparse.Namespace) -> None:
    print(
        f"model: hidden {HIDDEN}, {LAYERS} drafter layers, {HEADS}/{KV_HEADS} heads × {HEAD_DIM}, "
        f"vocab {args.vocab}, block {BLOCK_SIZE}; {args.prompts} prompt(s) × {args.tokens} "
        f"completion tokens; DDTree budgets {BUDGETS}; {args.threads} thread(s)"
    )
    results = {variant: _in_child(variant, args) for variant in VARIANTS}
    for variant, result in results.items():
        rate = result["blocks"] / result["seconds"]
        print(
            f"{variant:>11}: {result['blocks']} blocks in {result['seconds']:.2f} s = "
            f"{rate:.0f} blocks/s; peak RSS {result['peak_rss_mib']:.0f} MiB "
            f"({result['peak_rss_mib'] - result['setup_rss_mib']:.0f} MiB above setup)"
        )
    fast = results["batched"]
    for baseline in ("per-block", "uncached"):
        slow = results[baseline]
        rate_ratio = (fast["blocks"] / fast["seconds"]) / (slow["blocks"] / slow["seconds"])
        print(
            f"  batched vs {baseline}: blocks/s ratio {rate_ratio:.1f}× (target ≥ 5×), "
            f"wall-time ratio {slow['seconds'] / fast['seconds']:.1f}×, "
            f"metrics identical: {slow['metrics'] == fast['metrics']}"
        )
    print(f"  τ macro {fast['metrics']['tau_macro']:.4f}")
    print("  peak memory: resource.getrusage(RUSAGE_SELF).ru_maxrss of each variant's process\n")


if __name__ == "__main__":
    main()
