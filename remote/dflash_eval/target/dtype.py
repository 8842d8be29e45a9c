"""The dtype the target runs in, chosen before anything is loaded (the cache keys need it),
and the memory that takes.

dflash-spec.md §6: for Qwen3.5/3.6 targets the linear-attention layers run on GPUs through
`fla` kernels; on CPU transformers falls back to a pure-torch kernel whose bf16 output drifts
far enough to garble the drafter. So `choose_target_dtype` makes float32 the CPU default for
targets with linear attention when the host's memory allows it, and refuses with advice when
it does not. No torch: a dry run makes the same choice (plan/).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dflash_eval.contract.errors import HarnessError
from dflash_eval.target.config import TargetConfig

FLOAT32_MARGIN = 1.1  # float32 weights plus activations and the tokenizer must fit
BYTES_PER_ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2}


def dtype_key(name: str) -> str:
    """How the cache keys name a dtype: as torch prints it (`torch.bfloat16`)."""
    return f"torch.{name}"


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
