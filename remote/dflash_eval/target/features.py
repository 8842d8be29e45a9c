"""Where and how the target's features were computed, and how far they are from float32.

dflash-spec.md §6: a drafter is trained on features computed on GPUs; for Qwen3.5/3.6 targets the
linear-attention layers run there through `fla` kernels, while on CPU transformers falls back
to a pure-torch kernel whose bf16 output drifts far enough to garble the drafter. So:

- `kernel_record` names the kernels a forward uses (full attention: the transformers
  implementation we ask for; linear attention: `fla <version>` when importable, else the torch
  fallback) and goes into the cache key of hidden states and into results["features"];
- `choose_target_dtype` makes float32 the CPU default for targets with linear attention when
  the host's memory allows it, and refuses with advice when it does not;
- `measure_fidelity` compares, on one sequence, the features in the chosen dtype against a
  float32 forward of the same weights, layer by layer (relative error and cosine similarity).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dflash_eval.contract.errors import HarnessError
from dflash_eval.target.config import LINEAR_ATTENTION, TargetConfig
from dflash_eval.target.kernels import CONV1D, TORCH_FALLBACK, expected

ATTENTION_IMPLEMENTATION = "sdpa"  # asked for explicitly at load time, so it is known before
# Beyond either bound the features are too far from float32 to trust a drafter's τ on them.
# Tiny random 4-layer Qwen3.5 targets in bf16 (torch fallback) measure 0.25–0.6 % relative
# error and cosine ≥ 0.9999; bf16 error grows with depth, and a 64-layer target that garbled
# its drafter was far past these bounds. First bounds, to be calibrated against fla features.
FIDELITY_MAX_RELATIVE_ERROR = 0.05
FIDELITY_MIN_COSINE = 0.99
FLOAT32_MARGIN = 1.1  # float32 weights plus activations and the tokenizer must fit
BYTES_PER_ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2}


def linear_kernel() -> str:
    """What transformers should run linear attention with: fla when importable (it prefers
    the original package), else its pure-torch fallback."""
    return expected(LINEAR_ATTENTION)


def kernel_record(config: TargetConfig) -> dict[str, str]:
    """The kernels a forward is expected to run (the cache key's): what is installed. The
    forward itself then checks that it ran them (kernels.py)."""
    record = {"attention": ATTENTION_IMPLEMENTATION}
    if config.linear_attention_layers:
        record[LINEAR_ATTENTION] = expected(LINEAR_ATTENTION)
        record[CONV1D] = expected(CONV1D)
    return record


def feature_libraries() -> dict[str, str | None]:
    names = ("torch", "transformers", "flash-linear-attention", "triton", "causal-conv1d")
    return {name: _version(name) for name in names}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def provenance(device: str, dtype: str, dtype_source: str, kernel: dict[str, str]) -> dict:
    """The results' `features` object, before fidelity and load facts are added."""
    return {
        "host": socket.gethostname(),
        "device": device,
        "dtype": dtype,
        "dtype_source": dtype_source,
        "kernel": kernel,
        "libraries": feature_libraries(),
        "source": "computed here",
    }


# --- dtype ------------------------------------------------------------------------------------


def parse_meminfo(text: str) -> int | None:
    """MemAvailable from /proc/meminfo's text, in bytes (None when absent)."""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        return parse_meminfo(meminfo.read_text())
    except OSError:
        return None


NOT_TEXT_MODEL = ("visual", "vision", "mtp")  # tensors the text model never loads
HEADER_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8, "I64": 8, "I32": 4, "U8": 1, "BOOL": 1}


def text_tensors(path: Path) -> list[tuple[int, int]]:
    """(elements, bytes per element) of each tensor the text model loads, read from the
    safetensors headers alone (a vision tower and an MTP head are left out)."""
    from safetensors import safe_open

    found = []
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118
                if any(part in name for part in NOT_TEXT_MODEL):
                    continue
                tensor = handle.get_slice(name)
                elements = 1
                for size in tensor.get_shape():
                    elements *= size
                found.append((elements, HEADER_BYTES.get(tensor.get_dtype(), 4)))
    return found


def weight_bytes(path: Path) -> int:
    """Bytes of the text model's weights as saved: what loading it reads and holds."""
    return sum(elements * size for elements, size in text_tensors(path))


@dataclass(frozen=True)
class DtypeChoice:
    name: str  # float32 | bfloat16 | float16
    source: str  # why: what was asked, or the rule that chose it


def float32_shortfall(saved: str, saved_bytes: int, available: int | None) -> str | None:
    """Why the target's weights in float32 do not fit in `available` bytes (None: they do)."""
    needed = saved_bytes * BYTES_PER_ELEMENT["float32"] / BYTES_PER_ELEMENT.get(saved, 2)
    needed *= FLOAT32_MARGIN
    if available is not None and available >= needed:
        return None
    shown = "unknown" if available is None else f"{available / 2**30:.1f} GiB"
    return f"float32 weights need about {needed / 2**30:.1f} GiB; this host has {shown} available"


def choose_target_dtype(
    requested: str,
    saved: str,
    config: TargetConfig,
    saved_bytes: int,
    available: int | None,
    device: str = "cpu",
) -> DtypeChoice:
    """The target dtype: what was asked for; for 'auto' the saved dtype, except float32 on
    CPU for targets with linear attention (the bf16 torch fallback garbles the features)."""
    if requested != "auto":
        return DtypeChoice(requested, "--target-dtype")
    if device != "cpu" or not config.linear_attention_layers or saved == "float32":
        return DtypeChoice(saved, "auto: as saved")
    shortfall = float32_shortfall(saved, saved_bytes, available)
    if shortfall is None:
        return DtypeChoice("float32", "auto: float32 for linear attention on CPU")
    raise HarnessError(
        f"This target has linear-attention layers: on CPU their {saved} features drift far "
        f"from the GPU kernels the drafter was trained with, so the harness computes them in "
        f"float32: {shortfall}. Compute the features on a features host (fab "
        f"extract-features), or pass --target-dtype {saved} to accept the drift (the run "
        "then measures it and warns), or free memory."
    )


# --- fidelity ---------------------------------------------------------------------------------


def fidelity_needed(config: TargetConfig, layer_ids: list[int], dtype: str) -> str | None:
    """Why no fidelity check is needed (None: it is)."""
    if not config.drifts_up_to(layer_ids):
        return "no linear-attention layer up to the deepest target layer"
    if dtype == "float32" and all(
        expected(k) == TORCH_FALLBACK for k in (LINEAR_ATTENTION, CONV1D)
    ):
        return "features computed in float32 with the torch kernel: they are the reference"
    return None


def compare_layers(
    features: dict[int, torch.Tensor], reference: dict[int, torch.Tensor]
) -> dict[str, dict[str, float]]:
    """Per layer: ‖f − r‖ / ‖r‖ over all positions, and the mean and minimum cosine
    similarity of f and r per position."""
    rows = {}
    for layer, ref in reference.items():
        got = features[layer].float()
        ref = ref.float()  # [T, H]
        cosine = torch.nn.functional.cosine_similarity(got, ref, dim=-1)  # [T]
        rows[str(layer)] = {
            "relative_error": float((got - ref).norm() / ref.norm().clamp_min(1e-30)),
            "cosine_mean": float(cosine.mean()),
            "cosine_min": float(cosine.min()),
        }
    return rows


def judge(rows: dict[str, dict[str, float]]) -> list[str]:
    """The layers whose features exceed the documented bounds, as warning lines."""
    return [
        f"target layer {layer}: features differ from float32 by {row['relative_error']:.3g} "
        f"relative error (bound {FIDELITY_MAX_RELATIVE_ERROR}), cosine min "
        f"{row['cosine_min']:.4f} (bound {FIDELITY_MIN_COSINE}); the drafter's τ on these "
        "features may be garbage. Use float32 or a features host with the training kernels."
        for layer, row in rows.items()
        if row["relative_error"] > FIDELITY_MAX_RELATIVE_ERROR
        or row["cosine_min"] < FIDELITY_MIN_COSINE
    ]


def measure_fidelity(
    model: nn.Module,
    features: dict[int, torch.Tensor],
    forward: Any,
    available: int | None,
) -> dict[str, Any]:
    """Compare `features` (computed by `forward()` with the model as loaded) with the same
    forward after casting the model's floating weights to float32; the weights are cast back
    afterwards (bf16/fp16 → fp32 → back is exact)."""
    elements = sum(t.numel() for t in [*model.parameters(), *model.buffers()])
    if available is not None and available < elements * 4 * FLOAT32_MARGIN:
        return {"status": "skipped", "reason": "not enough memory for a float32 copy"}
    dtypes = _cast_floating(model, torch.float32)
    try:
        reference = forward()
    finally:
        _restore(model, dtypes)
    rows = compare_layers(features, reference)
    return {
        "status": "measured",
        "reference": "float32, same weights, torch kernels on this host",
        "layers": rows,
        "bounds": {
            "relative_error_max": FIDELITY_MAX_RELATIVE_ERROR,
            "cosine_min": FIDELITY_MIN_COSINE,
        },
        "within_bounds": not judge(rows),
    }


def _cast_floating(model: nn.Module, dtype: torch.dtype) -> dict[str, torch.dtype]:
    """Cast every floating parameter and buffer to `dtype`; return their original dtypes."""
    original = {}
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if tensor.is_floating_point():
                original[name] = tensor.dtype
                tensor.data = tensor.data.to(dtype)
    return original


def _restore(model: nn.Module, dtypes: dict[str, torch.dtype]) -> None:
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name in dtypes:
                tensor.data = tensor.data.to(dtypes[name])
