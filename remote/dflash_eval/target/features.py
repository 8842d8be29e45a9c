"""Where and how the target's features are computed, and the bounds on their distance from
float32.

dflash-spec.md §6: a drafter is trained on features computed on GPUs; for Qwen3.5/3.6 targets the
linear-attention layers run there through `fla` kernels, while on CPU transformers falls back
to a pure-torch kernel whose bf16 output drifts far enough to garble the drafter. So:

- `kernel_record` names the kernels a forward uses (full attention: the transformers
  implementation we ask for; linear attention: `fla <version>` when importable, else the torch
  fallback) and goes into the cache key of hidden states and into results["features"];
- dtype.py makes float32 the CPU default for targets with linear attention;
- fidelity.py measures, on one sequence, the features in the chosen dtype against a float32
  forward of the same weights, layer by layer; `judge` holds them to the bounds below.

No torch: a dry run keys its cache lookups with `kernel_record` (plan/).
"""

from __future__ import annotations

import socket
from importlib import metadata

from dflash_eval.target.config import LINEAR_ATTENTION, TargetConfig
from dflash_eval.target.kernels import CONV1D, TORCH_FALLBACK, expected

ATTENTION_IMPLEMENTATION = "sdpa"  # asked for explicitly at load time, so it is known before
# Beyond either bound the features are too far from float32 to trust a drafter's τ on them.
# Tiny random 4-layer Qwen3.5 targets in bf16 (torch fallback) measure 0.25–0.6 % relative
# error and cosine ≥ 0.9999; bf16 error grows with depth, and a 64-layer target that garbled
# its drafter was far past these bounds. First bounds, to be calibrated against fla features.
FIDELITY_MAX_RELATIVE_ERROR = 0.05
FIDELITY_MIN_COSINE = 0.99


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
