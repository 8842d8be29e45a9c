"""The target model (dflash-spec.md §6): load with transformers, find its parts by structure,
extract context features, generate greedily.

Supported: Qwen3 (`model.layers`), Qwen3.5/3.6 text models (mixed linear/full attention),
and the vision-language wrappers whose decoder sits under `model.language_model`.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dflash_eval.contract.errors import HarnessError
from dflash_eval.target.config import TargetConfig, TargetShape, read_target_config
from dflash_eval.target.features import ATTENTION_IMPLEMENTATION
from dflash_eval.target.kernels import KernelWatch
from dflash_eval.target.placement import Placement, Shard, plan, require_placed, units_of

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# A vision-language wrapper's text decoder, as its checkpoint names it.
TEXT_PREFIX_PATTERN = r"^model\.language_model\."


def resolve_dtype(name: str, config: TargetConfig) -> torch.dtype:
    """'auto' = the dtype the weights were saved in."""
    return DTYPES[config.saved_dtype if name == "auto" else name]


@dataclass
class Target:
    path: Path
    family: str
    model: nn.Module  # the top-level transformers model (None after release_body())
    decoder: nn.Module  # the text decoder: owns embed_tokens and layers
    embed_weight: torch.Tensor  # [V, H]
    head_weight: torch.Tensor  # [V, H] (lm_head; bias-free in the supported families)
    num_layers: int
    dtype: torch.dtype
    rms_norm_eps: float
    rope_theta: float
    device: str = "cpu"  # where the model runs: cpu, or cuda for a features host
    placement: Placement | None = None  # how it is split over several devices, when it is
    linear_layers: tuple[int, ...] = ()  # decoder layers with linear attention
    kernels_run: dict[str, Any] | None = None  # what the first feature forward ran (seen)

    @property
    def shape(self) -> TargetShape:
        return TargetShape(
            num_layers=self.num_layers,
            hidden_size=self.embed_weight.shape[1],
            vocab_size=self.embed_weight.shape[0],
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
        )

    @torch.inference_mode()
    def hidden_features(
        self, token_ids: list[int], layer_ids: list[int]
    ) -> dict[int, torch.Tensor]:
        """One causal forward over the tokens → {layer id: hidden_states[id + 1] [T, H]}.

        hidden_states[0] is the embedding output, so layer id i is the output of decoder
        layer i (for the last layer, transformers returns it after the final norm).
        """
        ids = torch.tensor([token_ids], device=self.device)

        def forward() -> Any:
            return self.model(
                input_ids=ids, output_hidden_states=True, use_cache=False, logits_to_keep=1
            )

        if self.kernels_run is None:
            watch = KernelWatch(self.decoder.layers)
            output = watch.run(forward)
            attention = getattr(self.model.config, "_attn_implementation", None) or "?"
            self.kernels_run = {"attention": attention, **watch.record(list(self.linear_layers))}
        else:
            output = forward()
        hidden = output.hidden_states
        if len(hidden) != self.num_layers + 1:
            raise HarnessError(
                f"Target {self.path} returned {len(hidden)} hidden states for "
                f"{self.num_layers} decoder layers (expected {self.num_layers + 1}: embeddings "
                "plus one per layer). This transformers version lays hidden states out "
                "differently; the layer mapping would be wrong, so the run stops."
            )
        # A copy in host memory: the outputs of all layers are freed, the features cached.
        return {i: hidden[i + 1][0].to("cpu", copy=True) for i in layer_ids}

    @torch.inference_mode()
    def greedy(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: list[int]) -> list[int]:
        """The target's own greedy continuation (stops after a stop token)."""
        ids = torch.tensor([prompt_ids], device=self.device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            output = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                max_new_tokens=max_new_tokens,
                eos_token_id=stop_ids or None,
                pad_token_id=stop_ids[0] if stop_ids else 0,
            )
        completion = output[0, len(prompt_ids) :].tolist()
        for index, token in enumerate(completion):
            if token in stop_ids:
                return completion[: index + 1]
        return completion

    def release_body(self) -> None:
        """Free the decoder once features are extracted; keep embedding and head."""
        self.embed_weight = self.embed_weight.detach().clone()
        self.head_weight = self.head_weight.detach().clone()
        self.model = None  # type: ignore[assignment]
        self.decoder = None  # type: ignore[assignment]


def load_target(
    path: Path,
    dtype_name: str = "auto",
    device: str = "cpu",
    config: TargetConfig | None = None,
    shard: Shard | None = None,
) -> Target:
    """The target on `device`, or split over `shard.devices` (placement.py)."""
    path = Path(path)
    config = config or read_target_config(path)
    dtype = resolve_dtype(dtype_name, config)
    placement = plan_placement(config, dtype, shard) if shard is not None else None
    model = _load_text_model(path, config, dtype, placement)
    if placement is None:
        model.to(device)
    model.eval()
    require_loaded_as(model, dtype, device, path)
    if placement is not None:
        require_placed(model, placement, path)
    decoder = find_decoder(model, path)
    head = model.get_output_embeddings()
    if head is None or getattr(head, "bias", None) is not None:
        raise HarnessError(
            f"Target {path}: no bias-free LM head found (get_output_embeddings() returned "
            f"{type(head).__name__}). The drafter needs the target's lm_head."
        )
    return Target(
        path=path,
        family=config.family,
        model=model,
        decoder=decoder,
        embed_weight=decoder.embed_tokens.weight,
        head_weight=head.weight,
        num_layers=len(decoder.layers),
        dtype=dtype,
        rms_norm_eps=config.shape.rms_norm_eps,
        rope_theta=config.shape.rope_theta,
        device=placement.devices[0] if placement else device,
        placement=placement,
        linear_layers=tuple(config.linear_attention_layers),
    )


def _text_options(config: TargetConfig, dtype: torch.dtype) -> dict[str, Any]:
    """What transformers needs to build the text model alone: a vision-language wrapper's
    text config, its checkpoint's text keys mapped (`model.language_model.*` → `model.*`)."""
    options: dict[str, Any] = {
        "dtype": dtype,
        # Named, not left to transformers' default, so the cache key and the results can say
        # which attention implementation computed the features.
        "attn_implementation": ATTENTION_IMPLEMENTATION,
    }
    if config.vision_language:
        text = copy.deepcopy(config.hf_config.get_text_config())
        text.tie_word_embeddings = config.tied_embeddings
        options |= {"config": text, "key_mapping": {TEXT_PREFIX_PATTERN: "model."}}
    return options


def text_skeleton(config: TargetConfig, dtype: torch.dtype) -> nn.Module:
    """The text model built from its config alone, on the meta device (no memory): the
    module names and sizes a placement plan is made from."""
    import transformers

    options = _text_options(config, dtype)
    text = options.get("config", config.hf_config)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_config(
            text, dtype=dtype, attn_implementation=ATTENTION_IMPLEMENTATION
        )


def plan_placement(config: TargetConfig, dtype: torch.dtype, shard: Shard) -> Placement:
    """Where each module of the text model goes when split over `shard.devices`."""
    skeleton = text_skeleton(config, dtype)
    decoder = find_decoder(skeleton, config.path)
    name = next(name for name, module in skeleton.named_modules() if module is decoder)
    units = units_of(skeleton, name, dtype.itemsize, config.tied_embeddings)
    return plan(units, list(shard.devices), shard.cap_bytes)


def _load_text_model(
    path: Path, config: TargetConfig, dtype: torch.dtype, placement: Placement | None = None
) -> nn.Module:
    """The text decoder and LM head only. A vision-language wrapper's checkpoint is read into
    its text model: the vision tower and the MTP head are never materialised. Every text
    weight must come from the files (none left at its random init), or the run stops. With a
    placement, each weight loads straight onto its device."""
    import transformers

    transformers.utils.logging.disable_progress_bar()  # stderr is for our messages
    options = _text_options(config, dtype) | {"output_loading_info": True}
    if placement is not None:
        options["device_map"] = placement.device_map
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, info = transformers.AutoModelForCausalLM.from_pretrained(str(path), **options)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise HarnessError(
            f"transformers {transformers.__version__} cannot load the target {path} "
            f"(model_type {config.model_type!r}): {error}. Check the directory is complete "
            "and that this transformers version supports the model family."
        ) from None
    missing = sorted(info.get("missing_keys") or [])
    mismatched = info.get("mismatched_keys") or []
    if missing or mismatched:
        shown = [*missing[:5], *(str(m[0]) for m in mismatched[:5])]
        raise HarnessError(
            f"Target {path}: {len(missing)} text weight(s) missing from its files and "
            f"{len(mismatched)} of the wrong shape (e.g. {', '.join(shown)}); they would be "
            "random. The checkpoint is incomplete or not the model its config describes."
        )
    return model


def require_loaded_as(model: nn.Module, dtype: torch.dtype, device: str, path: Path) -> None:
    """The loaded weights are in the dtype and on the device the results will record (a
    transformers release once ignored the requested dtype for this family)."""
    found = {(p.dtype, p.device.type) for p in model.parameters() if p.is_floating_point()}
    expected = (dtype, torch.device(device).type)
    if found != {expected}:
        shown = ", ".join(sorted(f"{d} on {v}" for d, v in found))
        raise HarnessError(
            f"Target {path}: asked transformers for {dtype} on {expected[1]}, but its weights "
            f"are {shown}. The results would record the wrong dtype; check the transformers "
            "version in the eval venv."
        )


def find_decoder(model: nn.Module, path: Path) -> nn.Module:
    """The module that owns the input embedding and the decoder layer list.

    Found by structure (whichever submodule holds both the model's input embedding as
    `embed_tokens` and an nn.ModuleList `layers`), so Qwen3 (`model`), Qwen3.5 text and
    the vision-language wrapper (`model.language_model`) are all found the same way.
    """
    embedding = model.get_input_embeddings()
    candidates = [
        (name, module)
        for name, module in model.named_modules()
        if getattr(module, "embed_tokens", None) is embedding
        and isinstance(getattr(module, "layers", None), nn.ModuleList)
    ]
    if len(candidates) != 1:
        raise HarnessError(
            f"Target {path}: expected exactly one text decoder (a module with the input "
            f"embedding as embed_tokens and a `layers` list), found "
            f"{[name or '<root>' for name, _ in candidates]}. Unsupported model layout."
        )
    return candidates[0][1]
