"""The golden fixture: a tiny target, a drafter trained on it for a few steps, and prompts,
all made from one seed in seconds, owing nothing to the lab (whose recipe may change).

Every starting weight is drawn with Python's own `random.Random` (documented to give the same
numbers on every platform and Python version), never with torch's or transformers' random
initialisation, which may change between versions. The target's LM head is given a habit
(each character's embedding points to the logit of its successor in one fixed cycle) with
a wide margin, so its greedy completions do not hinge on the last bits of a float; the
drafter is then trained on those completions with block cross-entropy (DFLASH.md §2) until it
drafts a few slots right, so that every counter of the metrics (acceptance per slot, DDTree
depths, capped rounds) is exercised with values above zero.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from dflash_eval.drafter.config import DrafterConfig
from dflash_eval.drafter.model import DFlashDrafter

SEED = 20261201
ALPHABET = "abcdefghijklmnopqrstuvwxyz .,;:!?"
SPECIALS = ("<|endoftext|>", "<|im_end|>", "<|mask|>", "<unk>")
BLOCK = 4
LAYERS = (0, 1)  # the target layers the drafter reads
PROMPTS = ("the cat sat", "a b c d", "hello, world!", "quiet; please")
TRAIN_STEPS = 50
# The width of the target's layers and of the drafter's alike.
SHAPE = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
}


def build(directory: Path) -> tuple[Path, Path, Path]:
    """(target directory, drafter checkpoint, prompts JSONL) under `directory`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one order of summation while training
    try:
        draw = random.Random(SEED)
        tokenizer = _tokenizer(directory / "target")
        target = _target(directory / "target", len(tokenizer), tokenizer, draw)
        checkpoint = _drafter(directory / "step_100" / "checkpoint.pt", target, tokenizer, draw)
    finally:
        torch.set_num_threads(threads)
    prompts = directory / "prompts.jsonl"
    rows = [json.dumps({"id": f"golden-{i}", "prompt": text}) for i, text in enumerate(PROMPTS)]
    prompts.write_text("\n".join(rows) + "\n")
    return directory / "target", checkpoint, prompts


def _drawn(draw: random.Random, shape: tuple[int, ...], std: float) -> torch.Tensor:
    count = 1
    for size in shape:
        count *= size
    return torch.tensor([draw.gauss(0.0, std) for _ in range(count)]).reshape(shape)


def _draw_matrices(model: torch.nn.Module, draw: random.Random) -> None:
    """Every weight matrix drawn anew, in the order of the parameters' names (norms keep
    their ones)."""
    with torch.no_grad():
        for _name, parameter in sorted(model.named_parameters(), key=lambda item: item[0]):
            if parameter.ndim == 2:
                parameter.copy_(_drawn(draw, tuple(parameter.shape), 0.05))


def _tokenizer(directory: Path):
    """One token per character of ALPHABET, the specials first."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIALS + tuple(ALPHABET))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIALS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=SPECIALS[0], pad_token=SPECIALS[0], unk_token="<unk>"
    )
    tokenizer.save_pretrained(str(directory))
    return tokenizer


def _target(directory: Path, vocab_size: int, tokenizer, draw: random.Random):
    """A two-layer Qwen3 whose weights are all drawn here; its head walks a cycle."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    stops = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    config = Qwen3Config(
        **SHAPE,
        **stops,
        vocab_size=vocab_size,
        num_hidden_layers=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config).eval()
    _draw_matrices(model, draw)
    with torch.no_grad():
        embed = _drawn(draw, (vocab_size, config.hidden_size), 1.0)
        cycle = list(range(len(SPECIALS), vocab_size))
        draw.shuffle(cycle)
        head = torch.zeros(vocab_size, config.hidden_size)
        for here, successor in zip(cycle, cycle[1:] + cycle[:1], strict=True):
            head[successor] = embed[here] / embed[here].norm() * 6.0
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(head)
    model.save_pretrained(str(directory))
    return model


def _drafter(path: Path, target, tokenizer, draw: random.Random) -> Path:
    """A two-layer drafter (one of them sliding) trained on the target's greedy walks."""
    vocab_size = target.config.vocab_size
    first = len(SPECIALS)
    starts = torch.tensor(
        [[draw.randrange(first, vocab_size) for _ in range(6)] for _ in range(16)]
    )
    with torch.no_grad():
        walks = target.generate(
            starts,
            attention_mask=torch.ones_like(starts),
            do_sample=False,
            max_new_tokens=58,
            min_new_tokens=58,
            pad_token_id=tokenizer.pad_token_id,
        )  # [16, 64]
        hidden = target(walks, output_hidden_states=True).hidden_states
    features = torch.cat([hidden[i + 1] for i in LAYERS], dim=-1)  # [16, 64, 2·H]
    config = DrafterConfig(
        **SHAPE,
        num_hidden_layers=2,
        # A sliding layer narrower than the block: its mask rule shows in the numbers.
        layer_types=("sliding_attention", "full_attention"),
        sliding_window=3,
        target_layer_ids=LAYERS,
        block_size=BLOCK,
        mask_token_id=tokenizer.convert_tokens_to_ids("<|mask|>"),
        rms_norm_eps=1e-6,
        rope_theta=10_000.0,
        num_target_layers=2,
        vocab_size=vocab_size,
    )
    drafter = DFlashDrafter(config)
    _draw_matrices(drafter, draw)
    embed = target.model.embed_tokens.weight.detach()
    head = target.lm_head.weight.detach()
    optimizer = torch.optim.Adam(drafter.parameters(), lr=1e-2)
    for _ in range(TRAIN_STEPS):
        row = draw.randrange(walks.shape[0])
        anchors = torch.tensor(sorted(draw.sample(range(6, walks.shape[1] - BLOCK), 8)))
        tokens = walks[row]
        blocks = torch.full((len(anchors), BLOCK), config.mask_token_id)
        blocks[:, 0] = tokens[anchors]
        cache = drafter.context_cache(drafter.fuse_context(features[row]))
        drafted = drafter.forward_blocks(embed[blocks], anchors, cache)[:, 1:] @ head.T
        wanted = tokens[anchors[:, None] + torch.arange(1, BLOCK)]  # [8, B-1]
        loss = F.cross_entropy(drafted.reshape(-1, vocab_size), wanted.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    path.parent.mkdir(parents=True)
    state = {name: tensor.detach().clone() for name, tensor in drafter.state_dict().items()}
    torch.save({"model_state_dict": state, "step": 100, "config": config.to_hf_dict()}, path)
    return path
