"""What a features host's inventory entry adds to a harness host's: the GPUs the target is
split over (`gpus`, `gpu_memory`), and the packages its kernels need (`fla: true`).

`gpus: [4, 5, 6, 7]` are the host's CUDA device numbers as `nvidia-smi` counts them: the
harness runs with `CUDA_VISIBLE_DEVICES` set to them (in PCI bus order) and splits the target
over all of them, at most `gpu_memory` bytes of weights on each (remote/dflash_eval/
placement.py). Loading straight onto several GPUs goes through accelerate, so `gpus` adds it
to the venv as `fla` adds the kernel packages.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ValidationInfo

from dflash_ops.core.containers import Container
from dflash_ops.core.units import format_bytes, parse_size

# What the linear-attention layers of Qwen3.5/3.6 run on a GPU during training: the gated
# delta rule (fla) and the short causal convolution in front of it (causal-conv1d).
FLA_PACKAGES = ("flash-linear-attention", "causal-conv1d")
SHARDING_PACKAGES = ("accelerate",)
MIN_GPU_MEMORY = 1 << 30  # a cap under 1 GiB is surely a unit typo (40 instead of 40g)


def _gpu_list(value: list[int]) -> list[int]:
    if not value or len(set(value)) != len(value) or any(index < 0 for index in value):
        raise ValueError("a non-empty list of distinct GPU numbers ≥ 0, as nvidia-smi counts them")
    return value


def _gpu_memory(value: Any) -> int:
    try:
        size = parse_size(value)
    except (ValueError, TypeError):
        size = -1
    if size < MIN_GPU_MEMORY:
        raise ValueError(
            f"bytes of target weights per GPU of at least {format_bytes(MIN_GPU_MEMORY)}, e.g. 40g"
        )
    return size


def _runs_commands(container: Container | None) -> Container | None:
    if container is not None and container.kind == "rootfs":
        raise ValueError("a container that commands run in (kind pct or docker)")
    return container


def memory_needs_gpus(memory: int | None, info: ValidationInfo) -> int | None:
    """`gpu_memory` without `gpus` would cap nothing: refused, not ignored."""
    if memory is not None and not info.data.get("gpus"):
        raise ValueError("a cap per GPU of `gpus`, which is not set: list the GPUs too")
    return memory


CommandContainer = Annotated[Container | None, AfterValidator(_runs_commands)]
GpuList = Annotated[list[int], AfterValidator(_gpu_list)]
GpuMemory = Annotated[int, BeforeValidator(_gpu_memory)]


def with_packages(data: Any) -> Any:
    """A raw features-host entry with what its settings need added to `venv.packages` (a
    package already listed, pinned or not, is left as written): provisioning needs no
    special case."""
    if not isinstance(data, dict):
        return data
    wanted = [*(FLA_PACKAGES if data.get("fla") is True else ())]
    wanted += SHARDING_PACKAGES if data.get("gpus") else ()
    venv = data.get("venv")
    if not wanted or not isinstance(venv, dict):
        return data  # the venv's own validation says what is wrong
    packages = venv.get("packages") or []
    if not isinstance(packages, list):
        return data
    listed = [p for p in packages if isinstance(p, str)]
    missing = [name for name in wanted if not any(p.startswith(name) for p in listed)]
    if not missing:
        return data
    return {**data, "venv": {**venv, "packages": [*packages, *missing]}}
