"""Builders shared by the harness tests: tiny drafters, checkpoints, targets, quick runs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.progress import Progress
from dflash_eval.diagnose.diagnosis import DiagnoseOptions, run_diagnose
from dflash_eval.drafter.config import DrafterConfig
from dflash_eval.drafter.loaders import load_drafter
from dflash_eval.drafter.model import DFlashDrafter
from dflash_eval.run.evaluate import run_eval
from dflash_eval.run.options import EvalOptions
from dflash_eval.target.config import TargetShape

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# What the loader tests load drafters against: six layers, so that a drafter of
# small_config(num_target_layers=6) fits it.
LOADER_TARGET = TargetShape(
    num_layers=6, hidden_size=64, vocab_size=101, rms_norm_eps=1e-6, rope_theta=10_000.0
)


def small_config(**overrides: Any) -> DrafterConfig:
    values: dict[str, Any] = {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "target_layer_ids": (1, 3),
        "block_size": 6,
        "mask_token_id": 3,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10_000.0,
    }
    values.update(overrides)
    return DrafterConfig(**values)


def random_drafter(config: DrafterConfig, seed: int = 0, std: float = 0.2) -> DFlashDrafter:
    """A drafter with weights large enough that every term of the forward matters."""
    generator = torch.Generator().manual_seed(seed)
    model = DFlashDrafter(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim == 1:
                parameter.copy_(1.0 + 0.1 * torch.randn(parameter.shape, generator=generator))
            else:
                parameter.copy_(std * torch.randn(parameter.shape, generator=generator))
            del name
    return model.eval()


def save_training_checkpoint(
    path: Path,
    model: DFlashDrafter,
    *,
    prefix: str = "module.",
    with_config: bool = True,
    step: int = 1000,
    extra: dict[str, Any] | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = state_dict if state_dict is not None else model.state_dict()
    checkpoint: dict[str, Any] = {
        "model_state_dict": {prefix + name: t.clone() for name, t in state.items()},
        "optimizer_state_dict": {"state": {0: {"exp_avg": torch.zeros(4)}}, "param_groups": []},
        "step": step,
    }
    if with_config:
        checkpoint["config"] = model.config.to_hf_dict()
    checkpoint.update(extra or {})
    torch.save(checkpoint, path)
    return path


def loader_drafter() -> DFlashDrafter:
    """A random drafter that fits LOADER_TARGET."""
    return random_drafter(small_config(num_target_layers=6))


def same_weights(model: DFlashDrafter, reference: DFlashDrafter) -> bool:
    ours, theirs = model.state_dict(), reference.state_dict()
    return ours.keys() == theirs.keys() and all(torch.equal(t, theirs[k]) for k, t in ours.items())


def load_error(path: Path, **kwargs: Any) -> str:
    """The message of the HarnessError that loading `path` against LOADER_TARGET raises."""
    with pytest.raises(HarnessError) as caught:
        load_drafter(path, LOADER_TARGET, **kwargs)
    return str(caught.value)


def copy_tokenizer(source_dir: Path, target_dir: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copy(source_dir / name, target_dir / name)


def save_tiny_qwen3_5(
    directory: Path,
    tokenizer_dir: Path,
    vocab_size: int,
    wrapper: bool,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """A tiny Qwen3.5 text model (linear + full attention), or its vision-language wrapper,
    saved in `dtype`."""
    from transformers import (
        Qwen3_5Config,
        Qwen3_5ForCausalLM,
        Qwen3_5ForConditionalGeneration,
        Qwen3_5TextConfig,
    )

    torch.manual_seed(seed)
    text = Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        eos_token_id=0,
        pad_token_id=0,
    )
    if wrapper:
        vision = {
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "num_position_embeddings": 16,
        }
        model = Qwen3_5ForConditionalGeneration(
            Qwen3_5Config(text_config=text.to_dict(), vision_config=vision)
        )
    else:
        model = Qwen3_5ForCausalLM(text)
    model.to(dtype).save_pretrained(str(directory))
    copy_tokenizer(tokenizer_dir, directory)
    return directory


def quick_eval(lab, tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """A short, quiet evaluation on the lab models with its own cache; `overrides` replace
    any EvalOptions field."""
    options = EvalOptions(
        checkpoint=lab.checkpoints[6000],
        target=lab.target_dir,
        out=tmp_path / "r.json",
        threads=1,
        prompts=lab.prompts,
        num_prompts=3,
        max_new_tokens=48,
        cache_dir=tmp_path / "cache",
        ddtree=[4, 8],
    )
    for name, value in overrides.items():
        setattr(options, name, value)
    return run_eval(options, Progress(quiet=True))


def diagnose_lab(
    lab: Any,
    root: Path,
    candidate: Path,
    reference: Path,
    *,
    max_new_tokens: int = 96,
    against: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """`diagnose` of `candidate` against `reference` on a lab's target and prompts (named
    `against`, else after the reference's step directory)."""
    options = diagnose_options(lab, root, candidate, reference, max_new_tokens, **overrides)
    against = against or f"step {reference.parent.name.removeprefix('step_')}"
    return run_diagnose(DiagnoseOptions(options, against), Progress(quiet=True))


def diagnose_options(
    lab: Any,
    root: Path,
    candidate: Path,
    reference: Path,
    max_new_tokens: int = 96,
    **overrides: Any,
) -> EvalOptions:
    """The options of `diagnose_lab`'s run (its dry run plans the same); `overrides` may
    replace any of them (another target, say)."""
    chosen: dict[str, Any] = {
        "checkpoint": candidate,
        "target": lab.target_dir,
        "out": root / "diagnose.json",
        "threads": 1,
        "prompts": lab.prompts,
        "max_new_tokens": max_new_tokens,
        "cache_dir": root / "cache",
        "reference_drafter": reference,
    }
    return EvalOptions(**(chosen | overrides))
