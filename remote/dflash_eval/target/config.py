"""The target's configuration as transformers reads it (dflash-spec.md §6).

Layer kinds, shapes, RoPE and the saved dtype come from the config class transformers builds
for the model, never from raw JSON keys: a Qwen3.5/3.6 config may state its hybrid pattern only
as `full_attention_interval`, or not at all (the class then applies its default of one full
layer in four); raw keys would read such a target as having no linear-attention layer, and so
choose bf16 on CPU and skip the fidelity check. A `model_type` this transformers cannot build is
refused here, before anything is staged or loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_eval.contract.errors import HarnessError

LINEAR_ATTENTION = "linear_attention"
SAVED_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class TargetShape:
    """What the drafter config must agree with, read from the target's text config."""

    num_layers: int
    hidden_size: int
    vocab_size: int  # rows of the target's embedding matrix
    rms_norm_eps: float
    rope_theta: float


@dataclass(frozen=True)
class TargetConfig:
    path: Path
    model_type: str
    vision_language: bool  # a wrapper with a vision tower around the text decoder
    shape: TargetShape
    layer_types: tuple[str, ...]  # one per decoder layer, as transformers fills them in
    saved_dtype: str  # what the weights were saved in: float32 | bfloat16 | float16
    tied_embeddings: bool
    max_positions: int | None  # the decoder's context length, when the config states one
    hf_config: Any  # the transformers config object (its text part is `.get_text_config()`)

    @property
    def family(self) -> str:
        return self.model_type + (" (vision-language wrapper)" if self.vision_language else "")

    @property
    def linear_attention_layers(self) -> list[int]:
        """Decoder layers with linear attention (Qwen3.5/3.6), whose CPU kernel drifts."""
        return [i for i, kind in enumerate(self.layer_types) if kind == LINEAR_ATTENTION]

    def drifts_up_to(self, layer_ids: list[int]) -> bool:
        """Whether a linear-attention layer feeds any of these layers' hidden states: their
        features then depend on the kernel and dtype they are computed with."""
        return any(i <= max(layer_ids) for i in self.linear_attention_layers)


def read_target_config(path: Path) -> TargetConfig:
    """The target directory's config.json through transformers' own config class."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise HarnessError(
            f"Target {path} has no config.json. Expected a Hugging Face model directory "
            "(config.json, *.safetensors, tokenizer files) on the eval host."
        )
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as error:
        raise HarnessError(f"Target {path}: config.json is not a JSON object ({error}).") from None
    hf_config = _transformers_config(path, model_type)
    text = hf_config.get_text_config()
    layer_types = tuple(getattr(text, "layer_types", None) or ())
    return TargetConfig(
        path=path,
        model_type=str(model_type),
        vision_language=getattr(hf_config, "vision_config", None) is not None,
        shape=TargetShape(
            num_layers=int(text.num_hidden_layers),
            hidden_size=int(text.hidden_size),
            vocab_size=int(text.vocab_size),
            rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(text),
        ),
        layer_types=layer_types,
        saved_dtype=_saved_dtype(hf_config, text),
        tied_embeddings=bool(
            getattr(hf_config, "tie_word_embeddings", False)
            or getattr(text, "tie_word_embeddings", False)
        ),
        max_positions=getattr(text, "max_position_embeddings", None),
        hf_config=hf_config,
    )


def _transformers_config(path: Path, model_type: object) -> Any:
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(str(path))
    except (ValueError, KeyError, TypeError, OSError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise HarnessError(
            f"transformers {transformers.__version__} on this host cannot read the target "
            f"{path} (model_type {model_type!r}): {reason}. Install a transformers version "
            "that supports this model family in the eval venv (fab setup-eval-host pins a "
            "tested range), or check the target's config.json."
        ) from None


def _rope_theta(text: Any) -> float:
    """transformers 5 keeps RoPE settings in `rope_parameters`; older ones in `rope_theta`."""
    parameters = getattr(text, "rope_parameters", None) or {}
    theta = parameters.get("rope_theta") if isinstance(parameters, dict) else None
    return float(theta if theta is not None else getattr(text, "rope_theta", 1_000_000.0))


def _saved_dtype(hf_config: Any, text: Any) -> str:
    """The dtype the weights were saved in (bf16 for released Qwen models)."""
    for config in (hf_config, text):
        saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        name = str(saved).removeprefix("torch.") if saved is not None else None
        if name in SAVED_DTYPES:
            return name
    return "float32"
