"""How far the target's features in the run's dtype are from float32 (dflash-spec.md §6):
the same forward repeated with the weights cast to float32, compared layer by layer (relative
error and cosine similarity), and judged against features.py's bounds."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dflash_eval.target.dtype import FLOAT32_MARGIN
from dflash_eval.target.features import (
    FIDELITY_MAX_RELATIVE_ERROR,
    FIDELITY_MIN_COSINE,
    judge,
)


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
