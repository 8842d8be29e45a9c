"""Lab content: a tiny target model and tiny drafter checkpoints, built offline in seconds.

The target is a real Qwen3 model (transformers config, saved with save_pretrained) over a
character-level tokenizer built with the `tokenizers` library. A randomly initialised
target's greedy output is noise that no drafter can learn, so the target is given a
learnable habit: its embedding rows are large and its LM head maps each character's
embedding to the next character of one fixed random cycle through the alphabet. The
random transformer layers still run (they only perturb the residual stream a little), so
greedy decoding walks that cycle, which a drafter can learn.

The drafter checkpoints come from a short, real training run of the harness's drafter
(remote/dflash_eval/drafter/model.py) on the target's own greedy outputs with block cross-entropy
(DFLASH.md §2): predict g[s+1..s+B-1] from the anchor g[s], the mask tokens and the target
features of positions < s. Checkpoints are written in the training format (prefixed
model_state_dict, optimizer state, step, config), labelled 2000/4000/6000 but taken after
25 real optimisation steps per 1000 labelled (50, 100, 150), so τ rises from one to the next.

torch/transformers are imported inside functions: dflash_ops must not import torch at
module level.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import string
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

# Bump when the generated content changes, so cached lab models are rebuilt.
LAB_MODELS_VERSION = 2
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>", "<unk>")
MASK_TOKEN = "<|mask|>"
# The tokenizer's ordinary tokens: printable ASCII, one token per character, after the specials.
CHARACTERS = tuple(c for c in string.printable if c not in "\t\r\x0b\x0c")
# The tiny targets' sizes (the miniature Qwen3.6 has the same, and its own layer count).
TARGET_SIZES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}
BLOCK_SIZE = 8
PROMPT_LENGTH = 16
TRAIN_SEQUENCES = 48
# Long enough that the drafter sees the positions of a default eval (prompt + 256 tokens).
TRAIN_NEW_TOKENS = 400
# The labelled steps every build trains (one run, whatever subset a lab asks for).
LAB_STEPS = (2000, 4000, 6000)
# Real optimisation steps per 1000 "labelled" steps: 2000 → 50, 4000 → 100, 6000 → 150.
REAL_STEPS_PER_1000 = 25
LAB_PROMPTS = (
    "the quick brown fox jumps over the lazy dog",
    "def add(a, b): return a + b",
    "SELECT name FROM users WHERE id = 7;",
    "x = [i * i for i in range(10)]",
    "2 + 2 = 4, and 3 * 3 = 9!",
    "Why is the sky blue?",
    "print('hello, world')",
    "for (int i = 0; i < n; i++) {",
)


@dataclass(frozen=True)
class Training:
    """How a drafter is trained: the lab's recipe by default; faulty.py changes one thing."""

    layer_ids: tuple[int, ...] | None = None  # None: the default rule for two drafter layers
    block_size: int = BLOCK_SIZE
    # Soft targets: match the target's softmax at this temperature (KL) instead of its
    # greedy token (cross-entropy).
    soft_temperature: float | None = None
    # Per drafter layer, "full_attention" or "sliding_attention" (None: two full layers),
    # and the window of the sliding ones.
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    # Gaussian noise added to the target features the drafter is trained on, as a fraction of
    # their standard deviation (a training-side bug: eval feeds clean features).
    feature_noise: float | None = None


@dataclass(frozen=True)
class LabModels:
    target_dir: Path  # HF dir: config.json + model.safetensors + tokenizer files
    checkpoints: dict[int, Path]  # step -> training-format checkpoint.pt
    prompts: Path | None  # JSONL of prompts suited to the tiny model (None: built-ins)
    # A published-format reference drafter (HF dir); None: extract the last checkpoint.
    reference_dir: Path | None = None


def build_lab_models(cache_dir: Path, steps: Sequence[int] = LAB_STEPS, seed: int = 0) -> LabModels:
    """Build (or return the cached) tiny target, prompts and drafter checkpoints. One
    training run saves every step of LAB_STEPS (and any other asked for), so labs that
    use different steps share it; a step's weights do not depend on the others saved."""
    steps = tuple(sorted(set(int(s) for s in steps)))
    if not steps or min(steps) < 1:
        raise ValueError(f"steps must be positive integers, got {steps}")
    trained = tuple(sorted({*LAB_STEPS, *steps}))
    root = Path(cache_dir) / f"lab-models-{cache_key(trained, seed)}"
    models = LabModels(
        target_dir=root / "target",
        checkpoints={s: root / "checkpoints" / f"step_{s}" / "checkpoint.pt" for s in steps},
        prompts=root / "prompts.jsonl",
    )
    cached_build(root, lambda partial: _build(partial, trained, seed), trained, seed)
    return models


def cached_build(
    root: Path, build: Callable[[Path], None], steps: tuple[int, ...], seed: int
) -> None:
    """Run `build` into a fresh directory that becomes `root` once complete (nothing to do
    when `root` is already complete). One process builds at a time: parallel test workers
    needing the same models wait for the first build instead of each training them again."""
    if (root / "complete.json").is_file():
        return
    if not steps or min(steps) < 1:
        raise ValueError(f"steps must be positive integers, got {steps}")
    root.parent.mkdir(parents=True, exist_ok=True)
    with (root.parent / f"{root.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "complete.json").is_file():  # built while this process waited
            return
        # A private build directory, renamed into place when complete: an interrupted build
        # leaves no complete-looking directory.
        partial = Path(tempfile.mkdtemp(prefix=f"{root.name}.", suffix=".partial", dir=root.parent))
        try:
            build(partial)
            (partial / "complete.json").write_text(
                json.dumps({"steps": steps, "seed": seed}) + "\n"
            )
            partial.rename(root)
        finally:
            shutil.rmtree(partial, ignore_errors=True)


def cache_key(steps: tuple[int, ...], seed: int, version: object = LAB_MODELS_VERSION) -> str:
    libraries = ("torch", "transformers", "tokenizers", "safetensors")
    versions = {name: metadata.version(name) for name in libraries}
    key = {"version": version, "steps": steps, "seed": seed, "libraries": versions}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _build(root: Path, steps: tuple[int, ...], seed: int) -> None:
    import torch

    with one_thread():
        generator = torch.Generator().manual_seed(seed)
        tokenizer = build_tokenizer(root / "target")
        target = _build_target(root / "target", tokenizer, generator)
        write_prompts(root / "prompts.jsonl")
        train_drafter(root / "checkpoints", target, tokenizer, steps, generator)


def write_prompts(path: Path) -> None:
    """The lab's prompts as JSONL (what run-eval --prompts reads)."""
    lines = [json.dumps({"id": f"lab-{i}", "prompt": p}) for i, p in enumerate(LAB_PROMPTS)]
    path.write_text("\n".join(lines) + "\n")


def build_tokenizer(directory: Path) -> Any:
    """Character-level tokenizer (printable ASCII + specials) saved for AutoTokenizer."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *CHARACTERS])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
    )
    tokenizer.save_pretrained(str(directory))
    return tokenizer


def cycle_habit(vocab_size: int, hidden_size: int, tokenizer: Any, generator: Any) -> tuple:
    """(embedding, LM head) that make greedy decoding walk one fixed random cycle through the
    characters: large embedding rows, and a head that maps each character's row to the next
    character of the cycle (the random layers only perturb the residual stream a little)."""
    import torch

    embed = torch.randn(vocab_size, hidden_size, generator=generator)
    first = first_character(tokenizer)
    cycle = (first + torch.randperm(vocab_size - first, generator=generator)).tolist()
    head = torch.zeros(vocab_size, hidden_size)
    for here, successor in zip(cycle, cycle[1:] + cycle[:1], strict=True):
        # logit of `successor` peaks when the current token is `here`
        head[successor] = embed[here] / embed[here].norm() * 4.0
    return embed, head


def first_character(tokenizer: Any) -> int:
    return int(tokenizer.convert_tokens_to_ids(CHARACTERS[0]))


def new_target(tokenizer: Any, generator: Any) -> Any:
    """A randomly initialised tiny Qwen3 (six layers) over the tokenizer's vocabulary."""
    import torch
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    transformers.utils.logging.disable_progress_bar()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        num_hidden_layers=6,
        **TARGET_SIZES,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
    return Qwen3ForCausalLM(config)


@contextmanager
def one_thread() -> Iterator[None]:
    """Tiny tensors: one torch thread is fastest and avoids contention on a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _build_target(directory: Path, tokenizer: Any, generator: Any) -> Any:
    """Tiny Qwen3 whose greedy continuation follows a random cycle through the characters."""
    import torch

    model = new_target(tokenizer, generator).eval()
    embed, head = cycle_habit(len(tokenizer), model.config.hidden_size, tokenizer, generator)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(head)
    model.save_pretrained(str(directory))
    return model


def train_drafter(
    directory: Path,
    target: Any,
    tokenizer: Any,
    steps: tuple[int, ...],
    generator: Any,
    training: Training = Training(),
) -> None:
    """Train one drafter on the target's greedy outputs, saving a checkpoint per label."""
    import torch
    from dflash_eval.drafter.config import default_target_layer_ids
    from dflash_eval.drafter.model import DFlashDrafter

    sequences = _greedy_sequences(target, tokenizer, generator)  # [S, T]
    layer_ids = list(
        training.layer_ids or default_target_layer_ids(target.config.num_hidden_layers, 2)
    )
    with torch.no_grad():
        out = target(sequences, output_hidden_states=True)
    features = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)  # [S, T, K·H]
    if training.feature_noise:
        noise = torch.randn(features.shape, generator=generator)
        features = features + training.feature_noise * features.std() * noise
    config = _drafter_config(target, tokenizer, layer_ids, training)
    drafter = DFlashDrafter(config)
    for parameter in drafter.parameters():
        if parameter.ndim == 2:
            torch.nn.init.normal_(parameter, std=0.02, generator=generator)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3, weight_decay=0.0)
    save_at: dict[int, list[int]] = {}  # real optimisation step → labels saved there
    for label in steps:
        save_at.setdefault(max(1, label * REAL_STEPS_PER_1000 // 1000), []).append(label)
    for real_step in range(1, max(save_at) + 1):
        batch = torch.randint(0, sequences.shape[0], (8,), generator=generator)
        loss = torch.zeros(())
        for index in batch.tolist():
            soft = out.logits[index] if training.soft_temperature else None
            loss = loss + _block_loss(
                drafter, target, sequences[index], features[index], generator, training, soft
            )
        optimizer.zero_grad()
        (loss / len(batch)).backward()
        optimizer.step()
        for label in save_at.get(real_step, []):
            path = directory / f"step_{label}" / "checkpoint.pt"
            _save_checkpoint(path, drafter, optimizer, config, label, real_step)


def _drafter_config(target: Any, tokenizer: Any, layer_ids: list[int], training: Training) -> Any:
    """A small drafter for the tiny target, reading two of its layers."""
    from dflash_eval.drafter.config import DrafterConfig

    return DrafterConfig(
        hidden_size=target.config.hidden_size,
        intermediate_size=128,
        num_hidden_layers=len(training.layer_types or (0, 0)),
        layer_types=training.layer_types,
        sliding_window=training.sliding_window,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        target_layer_ids=tuple(layer_ids),
        block_size=training.block_size,
        mask_token_id=tokenizer.convert_tokens_to_ids(MASK_TOKEN),
        rms_norm_eps=target.config.rms_norm_eps,
        rope_theta=10_000.0,
        num_target_layers=target.config.num_hidden_layers,
        vocab_size=target.config.vocab_size,
    )


def _block_loss(
    drafter: Any,
    target: Any,
    tokens: Any,
    features: Any,
    generator: Any,
    training: Training,
    target_logits: Any = None,
) -> Any:
    """Block loss on one sequence at 8 random anchors s: slot k of the block that starts at
    g[s] predicts g[s+k], from the target features of positions < s. Cross-entropy on g, or
    (soft targets) KL to the target's own distribution at s+k-1, taken at the temperature."""
    import torch
    import torch.nn.functional as F

    block_size = training.block_size
    embed = target.model.embed_tokens.weight.detach()
    head = target.lm_head.weight.detach()
    last_anchor = tokens.shape[0] - block_size  # every slot of a training block has a label
    anchors = torch.randint(PROMPT_LENGTH, last_anchor + 1, (8,), generator=generator)
    block = torch.full((len(anchors), block_size), drafter.config.mask_token_id)
    block[:, 0] = tokens[anchors]
    cache = drafter.context_cache(drafter.fuse_context(features[:last_anchor]))
    out = drafter.forward_blocks(embed[block], anchors, cache)  # [N, B, H]
    logits = (out[:, 1:] @ head.T).reshape(-1, head.shape[0])  # [N·(B-1), V]
    positions = anchors[:, None] + torch.arange(1, block_size)  # [N, B-1]
    if training.soft_temperature is None:
        return F.cross_entropy(logits, tokens[positions].reshape(-1))
    soft = F.softmax(
        target_logits[positions - 1].reshape(logits.shape) / training.soft_temperature, -1
    )
    return F.kl_div(F.log_softmax(logits, dim=-1), soft, reduction="batchmean")


def _greedy_sequences(target: Any, tokenizer: Any, generator: Any) -> Any:
    """Random character prompts continued by the target's own greedy decoding."""
    import torch

    prompts = torch.randint(
        first_character(tokenizer),
        len(tokenizer),
        (TRAIN_SEQUENCES, PROMPT_LENGTH),
        generator=generator,
    )
    with torch.no_grad():
        return target.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=False,
            max_new_tokens=TRAIN_NEW_TOKENS,
            min_new_tokens=TRAIN_NEW_TOKENS,
            pad_token_id=tokenizer.pad_token_id,
        )


def _save_checkpoint(
    path: Path, drafter: Any, optimizer: Any, config: Any, label: int, real_step: int
) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    state = {f"module.{name}": t.detach().clone() for name, t in drafter.state_dict().items()}
    torch.save(
        {
            "model_state_dict": state,
            "optimizer_state_dict": optimizer.state_dict(),
            "step": label,
            "config": config.to_hf_dict(),
            "args": {"block_size": config.block_size, "real_optimizer_steps": real_step},
        },
        path,
    )
