"""A lab target whose next token depends on context, for faulty drafters whose fault only a
context-using drafter can show (faulty.py's layer-ids).

The main lab target (models.py) continues a fixed cycle: its next token depends on the
current one alone, its huge embedding rows dominate every layer (hidden states of all layers
have mean cosine 1.000), so its drafters need nothing from the target features and a drafter
fed other layers is no worse. This target is a tiny Qwen3 of the same sizes, *trained* (not
hand-set) to continue any sequence with the token LAG + 1 places back: its greedy output
repeats the last LAG + 1 tokens, so a drafter must read those from the features, and its
layers hold different representations (the embedding, then the copied token building up;
mean cosine between neighbouring layers' hidden states is measured by `layer_cosines`).

Its drafters are trained by models.train_drafter like the main lab's, and everything is
cached per library versions and seed with models.cached_build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflash_lab.models import (
    LabModels,
    build_tokenizer,
    cache_key,
    cached_build,
    first_character,
    new_target,
    one_thread,
    train_drafter,
    write_prompts,
)

CONTEXT_VERSION = "context-1"  # bump when the generated content changes
LAG = 2  # the target predicts x[t+1] = x[t-LAG]: its continuation has period LAG + 1
TARGET_STEPS = 200  # real optimisation steps of the target (copy loss < 0.01 by then)
TARGET_BATCH = 16
TARGET_LENGTH = 64  # RoPE makes the learnt offset hold far beyond the trained length
# The label of the drafter the faulty ones are held to: 600 real optimisation steps
# (models.REAL_STEPS_PER_1000). At 150, as the main lab's best, its drafters have barely
# begun to read the features (τ ≈ 1.3) and no layer probe rises beyond its interval.
DRAFTER_STEP = 24000


def build_context_lab(cache_dir: Path, seed: int = 0) -> LabModels:
    """Build (or return the cached) context target, the lab prompts and a drafter trained on
    it as the lab trains its own (labelled DRAFTER_STEP)."""
    steps = (DRAFTER_STEP,)
    root = Path(cache_dir) / f"context-lab-{cache_key(steps, seed, CONTEXT_VERSION)}"
    models = LabModels(
        target_dir=root / "target",
        checkpoints={DRAFTER_STEP: root / "checkpoints" / f"step_{DRAFTER_STEP}" / "checkpoint.pt"},
        prompts=root / "prompts.jsonl",
    )
    cached_build(root, lambda partial: _build(partial, steps, seed), steps, seed)
    return models


def _build(root: Path, steps: tuple[int, ...], seed: int) -> None:
    import torch

    with one_thread():
        generator = torch.Generator().manual_seed(seed)
        tokenizer = build_tokenizer(root / "target")
        target = _train_target(tokenizer, generator)
        target.save_pretrained(str(root / "target"))
        write_prompts(root / "prompts.jsonl")
        train_drafter(root / "checkpoints", target, tokenizer, steps, generator)


def _train_target(tokenizer: Any, generator: Any) -> Any:
    """A tiny Qwen3 trained on random characters to predict the token LAG places before
    the current one (cross-entropy at every position that has one)."""
    import torch
    import torch.nn.functional as F

    vocab_size = len(tokenizer)
    model = new_target(tokenizer, generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    first = first_character(tokenizer)
    for _ in range(TARGET_STEPS):
        tokens = torch.randint(
            first, vocab_size, (TARGET_BATCH, TARGET_LENGTH), generator=generator
        )
        logits = model(tokens).logits[:, LAG:]  # position t predicts tokens[t - LAG]
        labels = tokens[:, : TARGET_LENGTH - LAG]
        loss = F.cross_entropy(logits.reshape(-1, vocab_size), labels.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def layer_cosines(target: Any, tokens: Any) -> list[list[float]]:
    """Mean cosine similarity, over the positions of `tokens` [S, T], between the hidden
    states of every pair of layers (index 0: the embedding; i: the output of layer i-1)."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        hidden = target(tokens, output_hidden_states=True).hidden_states
    return [[float(F.cosine_similarity(a, b, dim=-1).mean()) for b in hidden] for a in hidden]
