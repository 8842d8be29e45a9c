"""Batched drafter passes vs straightforward per-block loops, on a small random model.

    .venv/bin/python benchmarks/harness.py [--threads 1,2] [--tokens 1024] [--prompts 1]
                                           [--repeats 3] [--vocab 4096] [--smoke]

`--smoke` runs every step at a size that takes seconds (the suite runs it so).

Three variants compute the same metrics (vanilla + DDTree walks) from the same random
context features: `batched` (the harness: chunks of consecutive anchors in one pass with a
block-structured mask), `per-block` (one forward per block, reusing the cached context
K/V) and `uncached` (one full forward per block, context K/V recomputed: what a naive
harness does). The script prints blocks/s of each (drafter time, as the harness reports
it; the walk's time is shown apart), the ratios (the ≥ 5× target is over the
straightforward `uncached` loop; over `per-block` the ratio is what batching alone adds),
whether the metrics are identical, and peak memory. Each variant runs in its own child
process so that its peak RSS (resource.getrusage ru_maxrss, which counts the imported
libraries it inherits) is its own; "above setup" subtracts the child's RSS once the model
and inputs are built.

It also prints a compute floor: the multiply-adds every variant must do, divided by the
rate of a cache-resident GEMM measured in the same run. No variant can beat it, so it
bounds the ratio any batching can reach on this machine and model.

Every variant shares the rest of the harness: the LM head over every slot (the greedy
draft and the log-softmax normaliser need the full vocabulary), top-k only for the slots a
DDTree can reach, and the Python walk. On a model this small that shared work and the
layers' own FLOPs are most of the batched variant's time, and the per-block loops' extra
cost is per-operation overhead and small, cache-resident GEMMs (with several threads, also
OpenMP synchronisation per small op); the ratios depend on the thread count and on how busy
the machine is, so each thread count is measured separately, after an untimed warm-up, as
the fastest of --repeats passes taken in turns with the other variants. On real sizes (H
4–5k, vocab 150–250k) a per-block loop re-reads every weight matrix per block, which
batching amortises.

With a random drafter nearly every draft is rejected (τ ≈ 1), so all variants visit the
same anchors. With a trained drafter the batched path computes every anchor while the walk
visits about 1/τ of them, so its wall-time advantage is the blocks/s ratio divided by τ.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import resource
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._smoke import parse_args

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 256, 2, 4, 2, 64
BLOCK_SIZE, PROMPT_TOKENS = 16, 64
WARM_UP_TOKENS = PROMPT_TOKENS + 256
BUDGETS = [4, 8, 16, 32]
VARIANTS = ("uncached", "per-block", "batched")
BASELINES = {
    "uncached": "the straightforward loop, one full drafter forward per block",
    "per-block": "batching alone: both reuse the cached context K/V",
}
TARGET = 5.0
SMOKE = {"threads": "1", "tokens": 24, "prompts": 1, "repeats": 1, "vocab": 512}


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _current_rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / (1 << 20)


def _predictor_class(variant: str):
    import torch
    from dflash_eval.walk.predict import PerBlockPredictor, Predictor, block_predictions

    class UncachedPerBlockPredictor(PerBlockPredictor):
        """What a naive harness does: the whole drafter forward per block, recomputing the
        fused context and its K/V every time."""

        @torch.inference_mode()
        def _predict(self, anchors: torch.Tensor, size: int | None = None) -> list:
            predictions = []
            for anchor in anchors.tolist():
                ctx = self.drafter.fuse_context(self._features[:anchor])
                embeds = self._block_embeds(torch.tensor([anchor]), size)[0]
                hidden = self.drafter.forward_uncached(ctx, embeds)
                predictions += block_predictions(self._logits(hidden[None]), self.top_k)
            return predictions

    return {
        "batched": Predictor,
        "per-block": PerBlockPredictor,
        "uncached": UncachedPerBlockPredictor,
    }[variant]


def _drafter_and_prompts(vocab: int, tokens_per_prompt: int, prompts: int):
    """A seeded random drafter, its borrowed head, and `prompts` (tokens, features) pairs."""
    import torch
    from dflash_eval.drafter.config import DrafterConfig
    from dflash_eval.drafter.model import DFlashDrafter
    from dflash_eval.walk.predict import BorrowedHead

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
    return drafter, head, sequences


def _run_variant(
    variant: str,
    tokens_per_prompt: int,
    prompts: int,
    threads: int,
    vocab: int,
    commands,
    results,
) -> None:
    """One variant in its own process: build, warm up, report ready, then one timed pass
    per "pass" command until "stop", then the peak memory."""
    import torch
    from dflash_eval.walk.metrics import Span, summarize, walk_prompt

    torch.set_num_threads(threads)
    drafter, head, sequences = _drafter_and_prompts(vocab, tokens_per_prompt, prompts)
    setup_rss = _current_rss_mib()
    predictor_class = _predictor_class(variant)

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
        span = Span(PROMPT_TOKENS, len(tokens))  # rounds over the whole completion
        return walk_prompt(predictor, tokens, span, BLOCK_SIZE, BUDGETS), predictor

    # Steady state, as over the many prompts of a real run: the first passes through the
    # kernels and the allocator are slow, so a short warm-up sequence goes untimed.
    tokens, features = sequences[0]
    walk_sequence(tokens[:WARM_UP_TOKENS], features[:WARM_UP_TOKENS])

    def timed_pass() -> dict:
        walks, blocks, drafter_seconds, started = [], 0, 0.0, time.perf_counter()
        for tokens, features in sequences:
            walked, predictor = walk_sequence(tokens, features)
            walks.append(walked)
            blocks += predictor.blocks_computed
            drafter_seconds += predictor.seconds
        return {
            "blocks": blocks,
            "seconds": time.perf_counter() - started,
            "drafter_seconds": drafter_seconds,
            "metrics": summarize(walks, BLOCK_SIZE, BUDGETS),
        }

    results.put("ready")
    while commands.get() == "pass":
        results.put(timed_pass())
    results.put({"peak_rss_mib": _peak_rss_mib(), "setup_rss_mib": setup_rss})


def _gemm_rate(threads: int, results) -> None:
    """Multiply-adds per second of an fp32 GEMM with the drafter's inner dimension, sized
    to stay in cache: about the best rate any variant's matrix products reach here."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(1024, HIDDEN), torch.randn(HIDDEN, 1024)
    torch.mm(a, b)
    repeats, started = 30, time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    results.put(repeats * a.numel() * b.shape[1] / (time.perf_counter() - started))


def _required_macs(tokens_per_prompt: int, prompts: int, vocab: int) -> int:
    """Multiply-adds every variant must do: the layers and the head on every slot of every
    block, each block's attention over its context and itself, the context's fusion and
    K/V once per sequence."""
    q_size, kv_size = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    per_token = 2 * HIDDEN * q_size + 2 * HIDDEN * kv_size + 3 * HIDDEN * 3 * HIDDEN
    length = PROMPT_TOKENS + tokens_per_prompt
    anchors = range(PROMPT_TOKENS, length - 1)
    per_sequence = len(anchors) * BLOCK_SIZE * per_token * LAYERS
    per_sequence += len(anchors) * (BLOCK_SIZE - 1) * HIDDEN * vocab
    per_sequence += sum(2 * q_size * BLOCK_SIZE * (s + BLOCK_SIZE) for s in anchors) * LAYERS
    per_sequence += length * (2 * HIDDEN * HIDDEN + 2 * HIDDEN * kv_size * LAYERS)
    return prompts * per_sequence


def _blocks_per_s(result: dict) -> float:
    """Drafter throughput as the harness reports it: blocks over the drafter's own time."""
    return result["blocks"] / result["drafter_seconds"]


def _measure(args: argparse.Namespace) -> dict[str, dict]:
    """Each variant's fastest pass and peak memory. The variants live in their own
    processes (so each peak RSS is its own) and take turns, one timed pass each per round,
    so that a slow spell of the machine (this VM's timings vary by ±20 %) hits them alike."""
    children = {}
    try:
        for variant in VARIANTS:
            commands = _CONTEXT.Queue()
            process, results = _start(
                _run_variant,
                variant,
                args.tokens,
                args.prompts,
                args.threads,
                args.vocab,
                commands,
            )
            children[variant] = (process, commands, results)
        for variant, (process, _, results) in children.items():
            # no pass is timed while another variant warms up
            assert _receive(variant, process, results) == "ready"
        passes: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
        for _ in range(args.repeats):
            for variant, (process, commands, results) in children.items():
                commands.put("pass")
                passes[variant].append(_receive(variant, process, results))
        measured = {}
        for variant, (process, commands, results) in children.items():
            commands.put("stop")
            memory = _receive(variant, process, results)
            process.join()
            fastest = min(passes[variant], key=lambda result: result["drafter_seconds"])
            measured[variant] = {**fastest, **memory}
        return measured
    finally:
        for process, _, _ in children.values():
            process.kill()  # a failed sibling leaves no child waiting for its next command


# Children fork from a server that has imported torch and the drafter's modules once: each
# starts without paying those imports again (seconds each), and owns its memory from there.
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(
    ["__main__", "torch", "dflash_eval.drafter.model", "transformers.models.qwen3.modeling_qwen3"]
)


def _child(target: Callable, results, *args) -> None:
    """A child's body: `target(*args, results)`; an exception is sent back as its
    traceback, which fails the benchmark (a child never dies silently)."""
    try:
        target(*args, results)
    except BaseException:
        results.put({"error": traceback.format_exc()})


def _start(target: Callable, *args) -> tuple:
    """`target(*args, results)` in a child of the fork server; (process, results queue)."""
    results = _CONTEXT.Queue()
    process = _CONTEXT.Process(target=_child, args=(target, results, *args), daemon=True)
    process.start()
    return process, results


def _receive(name: str, process, results) -> object:
    """The child's next message; the child's error, or its death, fails the benchmark at
    once (never a wait on a child that will not answer)."""
    while True:
        try:
            message = results.get(timeout=0.2)
        except queue.Empty:
            if process.is_alive():
                continue
            try:  # a last message may have been sent just before it ended
                message = results.get(timeout=1)
            except queue.Empty:
                raise SystemExit(
                    f"benchmark failed: {name}'s process ended (exit code {process.exitcode}) "
                    "without answering"
                ) from None
        if isinstance(message, dict) and "error" in message:
            raise SystemExit(f"benchmark failed in {name}'s process:\n{message['error']}")
        return message


def _in_child(target: Callable, *args) -> object:
    process, results = _start(target, *args)
    try:
        return _receive(target.__name__, process, results)
    finally:
        process.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--tokens", type=int, default=1024, help="completion tokens per prompt")
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed passes per variant; the fastest counts"
    )
    parser.add_argument(
        "--vocab",
        type=int,
        default=4096,
        help="LM head rows (default 4096: the head is then ~1/3 of a block's FLOPs, as in "
        "Qwen3-8B-DFlash; the whole vocabulary is computed for every slot in every variant)",
    )
    args = parse_args(parser, SMOKE)
    for threads in [int(t) for t in args.threads.split(",")]:
        args.threads = threads
        _compare(args)


def _compare(args: argparse.Namespace) -> None:
    print(
        f"model: hidden {HIDDEN}, {LAYERS} drafter layers, {HEADS}/{KV_HEADS} heads × {HEAD_DIM}, "
        f"vocab {args.vocab}, block {BLOCK_SIZE}; {args.prompts} prompt(s) × {args.tokens} "
        f"completion tokens; DDTree budgets {BUDGETS}; {args.threads} thread(s)"
    )
    results = _measure(args)
    for variant, result in results.items():
        print(
            f"{variant:>11}: {result['blocks']} blocks, drafter {result['drafter_seconds']:.2f} s "
            f"= {_blocks_per_s(result):.0f} blocks/s, {result['seconds']:.2f} s with the walk; "
            f"peak RSS {result['peak_rss_mib']:.0f} MiB "
            f"({result['peak_rss_mib'] - result['setup_rss_mib']:.0f} MiB above setup)"
        )
    fast = results["batched"]
    for baseline, meaning in BASELINES.items():
        slow = results[baseline]
        ratio = _blocks_per_s(fast) / _blocks_per_s(slow)
        if baseline == "uncached":
            meaning += f"; target ≥ {TARGET:.0f}×: {'met' if ratio >= TARGET else 'missed'}"
        print(
            f"  batched vs {baseline}: {ratio:.1f}× blocks/s ({meaning}), wall time "
            f"{slow['seconds'] / fast['seconds']:.1f}×, metrics identical: "
            f"{slow['metrics'] == fast['metrics']}"
        )
    macs = _required_macs(args.tokens, args.prompts, args.vocab)
    rate = _in_child(_gemm_rate, args.threads)
    floor = macs / rate
    print(
        f"  compute floor: {macs / 1e9:.1f} G multiply-adds in every variant ÷ {rate / 1e9:.0f} "
        f"G/s (a GEMM here, same threads) = {floor:.2f} s, at most "
        f"{fast['blocks'] / floor:.0f} blocks/s; batching can gain at most "
        f"{results['per-block']['drafter_seconds'] / floor:.1f}× over per-block, "
        f"{results['uncached']['drafter_seconds'] / floor:.1f}× over uncached"
    )
    print(f"  τ macro {fast['metrics']['tau_macro']:.4f}")
    print("  peak memory: resource.getrusage(RUSAGE_SELF).ru_maxrss of each variant's process\n")


if __name__ == "__main__":
    main()
