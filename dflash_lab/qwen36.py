"""Lab content `qwen3.6`: a miniature of the users' target, saved the way Qwen3.6-27B is.

The release is a `Qwen3_5ForConditionalGeneration` (model_type `qwen3_5`): a vision tower
(`model.visual.*`) around a hybrid text decoder (`model.language_model.*`, three
linear-attention layers to one full-attention layer), an untied `lm_head`, one multi-token
prediction layer (`mtp.*`, which transformers does not load), bf16 weights in numbered shards
with `model.safetensors.index.json`, a `generation_config.json` whose EOS is a list, and a chat
template that opens a `<think>` block unless `enable_thinking` is false. The miniature has
all of that at toy size: 8 decoder layers (`layer_types` and `full_attention_interval: 4`
both stated, as the release does), hidden size 64, the lab's character-level tokenizer.

Its text decoder walks the lab's random character cycle (models.cycle_habit). The drafters
are trained as the lab's own (models.train_drafter) on the text decoder in float32 with the
bf16-rounded weights, i.e. on the features the harness computes from the saved files. The
reference drafter is shaped like the public Qwen3.6-27B-DFlash one: causal sliding-window
layers, then one full layer; it is saved as a published Hugging Face directory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dflash_lab.models import (
    CHARACTERS,
    SPECIAL_TOKENS,
    TARGET_SIZES,
    LabModels,
    Training,
    cache_key,
    cached_build,
    cycle_habit,
    one_thread,
    train_drafter,
    write_prompts,
)

QWEN36_VERSION = "qwen3.6-2"  # bump when the generated content changes
# The release's vision and thinking tokens, after the lab's own specials.
QWEN36_SPECIALS = (
    *SPECIAL_TOKENS,
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<think>",
    "</think>",
)
# Thinking is on unless the caller passes enable_thinking=false (then an empty, closed
# <think> block), as Qwen3.6's template does.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}{{- '<think>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)
NUM_LAYERS = 8
FULL_ATTENTION_INTERVAL = 4
SHARDS = 4
# The reference drafter: causal sliding layers then a full one (the public drafter has four
# with a window of 2048, for prompts of thousands of tokens; the lab's are ~100 tokens).
REFERENCE = Training(
    layer_types=("sliding_attention", "sliding_attention", "full_attention"), sliding_window=32
)
REFERENCE_STEP = 6000


def build_qwen36_models(
    cache_dir: Path, steps: Sequence[int] = (2000, 4000, 6000), seed: int = 0
) -> LabModels:
    """Build (or return the cached) miniature Qwen3.6 target, its drafters and reference."""
    steps = tuple(sorted(set(int(s) for s in steps)))
    root = Path(cache_dir) / f"qwen36-models-{cache_key(steps, seed, QWEN36_VERSION)}"
    cached_build(root, lambda partial: _build(partial, steps, seed), steps, seed)
    return LabModels(
        target_dir=root / "target",
        checkpoints={s: root / "checkpoints" / f"step_{s}" / "checkpoint.pt" for s in steps},
        prompts=root / "prompts.jsonl",
        reference_dir=root / "reference-drafter",
    )


def _text_config(vocab_size: int, **ids: Any) -> Any:
    """The miniature's text decoder: Qwen3.6's hybrid 3:1 pattern at toy size."""
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=vocab_size,
        num_hidden_layers=NUM_LAYERS,
        **TARGET_SIZES,
        linear_key_head_dim=8,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        full_attention_interval=FULL_ATTENTION_INTERVAL,
        **ids,
    )


def _build(root: Path, steps: tuple[int, ...], seed: int) -> None:
    import torch

    with one_thread():
        generator = torch.Generator().manual_seed(seed)
        tokenizer = _tokenizer(root / "target")
        text = _text_decoder(tokenizer, generator)
        save_release(root / "target", text, tokenizer, generator)
        write_prompts(root / "prompts.jsonl")
        train_drafter(root / "checkpoints", text, tokenizer, steps, generator)
        train_drafter(root / "reference", text, tokenizer, (REFERENCE_STEP,), generator, REFERENCE)
        _publish(root / "reference" / f"step_{REFERENCE_STEP}" / "checkpoint.pt", root)


def _tokenizer(directory: Path) -> Any:
    """The lab's character vocabulary in the release's tokenizer class, which transformers
    imposes on every `qwen3_5` model (a byte-level BPE: each character is stored as its
    byte-level symbol, no merges), with the release's specials and chat template."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer

    symbol = bytes_to_unicode()
    characters = (symbol[ord(c)] for c in CHARACTERS)
    vocab = {token: index for index, token in enumerate([*QWEN36_SPECIALS, *characters])}
    tokenizer = Qwen3_5Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token="<unk>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN36_SPECIALS)})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(directory))
    return tokenizer


def _text_decoder(tokenizer: Any, generator: Any) -> Any:
    """The text decoder with the cycle habit, its weights rounded to bf16 (what the release
    stores) and held in float32 (what the harness computes CPU features in)."""
    import torch
    import transformers
    from transformers import Qwen3_5ForCausalLM

    transformers.utils.logging.disable_progress_bar()
    ids = _token_ids(tokenizer)
    config = _text_config(
        len(tokenizer), eos_token_id=ids["eos"], pad_token_id=ids["pad"], bos_token_id=None
    )
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
    model = Qwen3_5ForCausalLM(config).eval()
    embed, head = cycle_habit(len(tokenizer), config.hidden_size, tokenizer, generator)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(head)
    return model.to(torch.bfloat16).to(torch.float32)


def _token_ids(tokenizer: Any) -> dict[str, Any]:
    convert = tokenizer.convert_tokens_to_ids
    return {
        "eos": convert("<|im_end|>"),
        "pad": tokenizer.pad_token_id,
        "eos_list": [convert("<|im_end|>"), tokenizer.eos_token_id],
    }


def _vision_token_ids(tokenizer: Any) -> dict[str, int]:
    """The wrapper config's vision token ids (`image_token_id`, …), in the lab's vocabulary."""
    tokens = {
        "image": "<|image_pad|>",
        "video": "<|video_pad|>",
        "vision_start": "<|vision_start|>",
        "vision_end": "<|vision_end|>",
    }
    return {f"{key}_token_id": tokenizer.convert_tokens_to_ids(t) for key, t in tokens.items()}


def save_release(directory: Path, text: Any, tokenizer: Any, generator: Any) -> None:
    """Wrap the text decoder in the vision-language class with a random vision tower and add
    a random MTP layer; write config, generation config and bf16 shards with their index."""
    import torch
    from transformers import GenerationConfig, Qwen3_5Config, Qwen3_5ForConditionalGeneration

    ids = _token_ids(tokenizer)
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": text.config.hidden_size,
        "num_position_embeddings": 16,
    }
    config = Qwen3_5Config(
        text_config=text.config.to_dict(),
        vision_config=vision,
        tie_word_embeddings=False,
        **_vision_token_ids(tokenizer),
    )
    model = Qwen3_5ForConditionalGeneration(config)
    model.model.language_model.load_state_dict(text.model.state_dict())  # strict
    model.lm_head.load_state_dict(text.lm_head.state_dict())
    tensors = {name: t.to(torch.bfloat16) for name, t in model.state_dict().items()}
    tensors |= {name: t.to(torch.bfloat16) for name, t in _mtp_weights(text, generator).items()}
    _write_shards(directory, tensors)
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(str(directory))
    _release_config(directory / "config.json")
    GenerationConfig(
        eos_token_id=ids["eos_list"],
        pad_token_id=ids["pad"],
        do_sample=True,
        temperature=0.6,
        top_k=20,
        top_p=0.95,
    ).save_pretrained(str(directory))


def _mtp_weights(text: Any, generator: Any) -> dict[str, Any]:
    """One multi-token-prediction layer named as the release names it: `mtp.fc` over
    [embedding; hidden], two pre-fc norms, a full-attention decoder layer, a final norm."""
    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer

    hidden = text.config.hidden_size
    full = text.config.layer_types.index("full_attention")
    layer = Qwen3_5DecoderLayer(text.config, full)
    weights = {f"mtp.layers.0.{name}": t for name, t in layer.state_dict().items()}
    weights["mtp.fc.weight"] = 0.02 * torch.randn(hidden, 2 * hidden, generator=generator)
    for norm in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        weights[f"mtp.{norm}.weight"] = torch.zeros(hidden)
    return weights


def _write_shards(directory: Path, tensors: dict[str, Any]) -> None:
    """`model-0000i-of-0000N.safetensors` and the index, as save_pretrained would name them."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    per_shard = -(-len(names) // SHARDS)
    weight_map = {}
    for index in range(SHARDS):
        file = f"model-{index + 1:05d}-of-{SHARDS:05d}.safetensors"
        chunk = {
            name: tensors[name].contiguous() for name in names[index * per_shard :][:per_shard]
        }
        save_file(chunk, str(directory / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(chunk, file)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _release_config(path: Path) -> None:
    """State the hybrid pattern both ways and the MTP depth, as the release's config does
    (transformers keeps `layer_types` and drops the interval when it saves)."""
    config = json.loads(path.read_text())
    config["text_config"]["full_attention_interval"] = FULL_ATTENTION_INTERVAL
    config["text_config"]["mtp_num_hidden_layers"] = 1
    config["text_config"]["dtype"] = "bfloat16"
    config["dtype"] = "bfloat16"
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _publish(checkpoint: Path, root: Path) -> None:
    """The reference as z-lab publishes drafters: config.json + model.safetensors."""
    import torch
    from safetensors.torch import save_file

    saved = torch.load(checkpoint, weights_only=True)
    out = root / "reference-drafter"
    out.mkdir()
    state = {name.removeprefix("module."): t for name, t in saved["model_state_dict"].items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(saved["config"], indent=2) + "\n")
