"""scripts/gpu_check.py's served check, its plumbing (export, launch, health, served-eval,
teardown, the CPU τ in SGLang's count) driven on CPU with the SGLang stand-in
(tests/stand_ins) as the "SGLang installation"; real SGLang on a GPU is what it is for."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

import pytest

from dflash_lab.content import MODEL_CACHE

pytestmark = pytest.mark.long(25)  # seconds in a cold `make test` (5 workers)

ROOT = Path(__file__).resolve().parents[2]


def test_the_served_check_drives_an_sglang_launch_to_the_cpu_tau(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    python = tmp_path / "sglang-python"
    path = f"{ROOT / 'tests' / 'stand_ins'}:{ROOT / 'remote'}:{ROOT}"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={path} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    [line] = gpu_check.check_served(str(python), tmp_path, MODEL_CACHE, port)
    assert line.startswith("served: SGLang DFLASH τ macro ") and line.endswith(": ok"), line
    # The record's prompts pair with the CPU run's by id: the paired test judged it.
    assert "paired over 4 prompts, served − CPU = " in line, line
