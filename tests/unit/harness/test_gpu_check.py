"""scripts/gpu_check.py without a GPU: it says so in one line and exits 0, and its checks
run on CPU "devices" (the same code it runs on CUDA; here it compares CPU with CPU)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash_lab.content import MODEL_CACHE

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script runs for real")
def test_without_cuda_it_says_so_in_one_line_and_exits_0():
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0
    assert done.stdout.splitlines() == [
        f"gpu_check: skipped: torch {torch.__version__} sees no CUDA device here"
    ]


def test_its_checks_run_and_pass_on_cpu_devices(gpu_check, tmp_path):
    target_dir = gpu_check.build_target(tmp_path / "target", layers=4)
    tokens = gpu_check._tokens(24)
    fidelity = gpu_check.check_fidelity(target_dir, "cpu", tokens)
    heads = [line for line in fidelity if line.startswith("fidelity")]
    assert [line.split(":")[0] for line in heads] == [
        "fidelity bfloat16 on cpu",
        "fidelity float32 on cpu",
    ]
    assert heads[1].endswith(": ok") and "'linear_attention': 'torch fallback'" in heads[1]
    assert len(fidelity) == 2 + 2 * 4  # a line per layer and dtype
    sharding = gpu_check.check_sharding(target_dir, ["cpu", "cpu"], tokens)
    assert sharding[-1].endswith(": ok")
    drafter = gpu_check.check_drafter("cpu")
    assert drafter[0].endswith(": ok") and "relative error 0 " in drafter[0]
    assert gpu_check.run_checks([("crash", lambda: 1 / 0)]) is False


def test_its_eval_check_runs_the_whole_eval_on_a_device(gpu_check, tmp_path):
    lines = gpu_check.check_eval("cpu", tmp_path, MODEL_CACHE)  # the tier's lab models
    assert lines[0].startswith("eval on cpu (features on cpu): tau macro ")
    assert lines[0].endswith("0.00% apart (tolerance 2%): ok")
