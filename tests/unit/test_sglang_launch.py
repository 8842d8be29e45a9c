"""The probes and the inventory section of `fab served-eval`'s own SGLang server, on captured
output (the commands themselves run against the lab: tests/e2e/test_served_eval.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dflash_ops.core.sglang_launch import SglangLaunch
from dflash_ops.remote.probes import ProbeParseError
from dflash_ops.remote.sglang_launch import NO_SMI, parse_gpu_users

CAPTURED = """0, GPU-7a1f0c2e-aaaa
1, GPU-9b2e1d3f-bbbb
@@apps
GPU-9b2e1d3f-bbbb, 31337
GPU-9b2e1d3f-bbbb, 31338
GPU-ffffffff-gone, 1
"""


def test_each_gpus_compute_processes_are_read_by_index():
    assert parse_gpu_users(CAPTURED) == {0: [], 1: ["31337", "31338"]}


def test_a_host_without_nvidia_smi_or_with_odd_output_is_refused_not_guessed():
    with pytest.raises(ProbeParseError, match="nvidia-smi is not on the host's PATH"):
        parse_gpu_users(NO_SMI + "\n")
    with pytest.raises(ProbeParseError, match="unexpected nvidia-smi"):
        parse_gpu_users("NVIDIA-SMI has failed\n")


def test_the_section_takes_an_absolute_python_gpus_and_a_port_range():
    launch = SglangLaunch(python="/opt/sglang/bin/python", gpus=[0, 1], ports="30100-30102")
    assert list(launch.port_numbers()) == [30100, 30101, 30102]
    for bad in ({"python": "python3"}, {"ports": "30102-30100"}, {"ports": "80-90"}):
        values = {"python": "/opt/sglang/bin/python", "gpus": [0], "ports": "30100-30101"}
        with pytest.raises(ValidationError):
            SglangLaunch(**{**values, **bad})
