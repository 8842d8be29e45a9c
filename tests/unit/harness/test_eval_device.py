"""`eval --device`: the CPU stays the default and is recorded; CUDA is asked for explicitly,
refused in one line where torch sees no GPU, and for sampled runs. (The CUDA path itself
runs in scripts/gpu_check.py, on a machine with a GPU.)"""

from __future__ import annotations

import pytest
import torch
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.parser import build_parser
from dflash_eval.run.prepared import run_device
from dflash_eval.target.device import resolve_device

from .helpers import quick_eval


def test_the_cpu_is_the_default_and_is_recorded(lab, tmp_path):
    assert (
        build_parser()
        .parse_args(["eval", "--checkpoint", "c", "--target", "t", "--out", "o"])
        .device
        is None
    )
    results = quick_eval(lab, tmp_path, num_prompts=1, max_new_tokens=16)
    assert results["host"]["device"] == "cpu"
    assert results["features"]["device"] == "cpu"
    assert results["options"]["device"] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_cuda_without_a_gpu_is_one_line_saying_what_to_do(lab, tmp_path):
    with pytest.raises(HarnessError) as caught:
        quick_eval(lab, tmp_path, device="cuda")
    assert str(caught.value) == (
        f"--device cuda, but torch {torch.__version__} sees no CUDA device on this host. "
        "Install a CUDA build of torch in the eval venv (venv.torch: cuda), or use --device "
        "cpu."
    )


def test_sampled_runs_stay_on_the_cpu():
    with pytest.raises(HarnessError, match=r"--device cuda evaluates greedy runs"):
        run_device("cuda", True, resolve_device)
    assert run_device("auto", True, resolve_device) == "cpu"
    assert run_device(None, False, resolve_device) == "cpu"


def test_a_greedy_run_computes_where_the_host_says_its_device_is():
    # A stand-in resolver for a host with a GPU: this machine has none.
    with_gpu = {"auto": "cuda", "cuda": "cuda", "cpu": "cpu"}.__getitem__
    assert run_device("auto", False, with_gpu) == "cuda"
    assert run_device(None, False, with_gpu) == "cpu"  # the CPU unless asked for
    assert run_device("auto", True, with_gpu) == "cpu"  # sampled: CPU random streams
