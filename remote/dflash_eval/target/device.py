"""The device a run computes on (`--device`): what torch sees on this host decides `auto`, and
`cuda` where torch sees no CUDA device is refused.

A dry run imports no torch (plan/), so it asks torch in a child process (`torch_in_child`);
the answer is the one the run's own process will get from the same interpreter.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from dflash_eval.contract.errors import HarnessError

# (whether torch sees a CUDA device, torch's version)
CudaProbe = Callable[[], tuple[bool, str]]
_ASK_TORCH = "import torch; print(int(torch.cuda.is_available()), torch.__version__)"


def torch_here() -> tuple[bool, str]:
    import torch

    return torch.cuda.is_available(), torch.__version__


def torch_in_child() -> tuple[bool, str]:
    answer = subprocess.run(
        [sys.executable, "-c", _ASK_TORCH], capture_output=True, text=True, check=False
    )
    if answer.returncode != 0:
        raise HarnessError(
            f"Cannot ask torch which devices it sees ({sys.executable} failed: "
            f"{answer.stderr.strip()[-300:]}). Check the eval venv (fab setup-eval-host)."
        )
    available, version = answer.stdout.split()
    return available == "1", version


def resolve_device(requested: str, probe: CudaProbe = torch_here) -> str:
    """The device a run asked for: CUDA when asked for or (auto) present, else the CPU.
    `cpu` needs no answer from torch."""
    if requested == "cpu":
        return requested
    cuda, version = probe()
    if requested == "auto":
        return "cuda" if cuda else "cpu"
    if requested == "cuda" and not cuda:
        raise HarnessError(
            f"--device cuda, but torch {version} sees no CUDA device on this host. "
            "Install a CUDA build of torch in the eval venv (venv.torch: cuda), or use --device "
            "cpu."
        )
    return requested


def resolve_device_without_torch(requested: str) -> str:
    """resolve_device for a process that must not import torch (the dry run)."""
    return resolve_device(requested, torch_in_child)
