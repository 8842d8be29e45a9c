"""The kernel record says what the target's forward ran, seen during the forward
(target/kernels.py), not what an installed package suggests."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from dflash_eval.contract.errors import HarnessError
from dflash_eval.target.config import read_target_config
from dflash_eval.target.features import kernel_record
from dflash_eval.target.kernels import KernelWatch, require_as_expected
from dflash_eval.target.model import load_target

from .helpers import save_tiny_qwen3_5


def test_each_linear_attention_layer_is_seen_running_the_torch_fallbacks(lab, tmp_path):
    target_dir = save_tiny_qwen3_5(tmp_path / "t", lab.target_dir, 101, wrapper=True)
    target = load_target(target_dir, "float32")
    assert target.linear_layers == (0, 1, 2)  # layer 3 is full attention
    watch = KernelWatch(target.decoder.layers)
    watch.run(lambda: target.model(input_ids=torch.tensor([[5, 6, 7, 8, 9]]), use_cache=False))
    for kind in ("linear_attention", "conv1d"):
        assert watch.seen[kind] == {layer: {"torch fallback"} for layer in (0, 1, 2)}
    assert watch.record([0, 1, 2]) == {
        "linear_attention": "torch fallback",
        "conv1d": "torch fallback",
    }
    # The harness's own forward keeps the first record it saw, with the attention it used.
    target.hidden_features([5, 6, 7, 8], [1])
    assert target.kernels_run == {
        "attention": "sdpa",
        "linear_attention": "torch fallback",
        "conv1d": "torch fallback",
    }
    assert target.kernels_run == kernel_record(read_target_config(target_dir))


def test_calls_into_a_kernel_package_are_credited_to_the_layer_that_made_them(tmp_path):
    # A STAND-IN package named causal_conv1d (the real one needs CUDA): what counts is that
    # its code ran under layer 1, and nothing under layer 0.
    package = tmp_path / "causal_conv1d"
    package.mkdir()
    (package / "__init__.py").write_text("def conv(x):\n    return x + 1\n")
    spec = importlib.util.spec_from_file_location("causal_conv1d", package / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class Calls(torch.nn.Module):
        def forward(self, x):
            return module.conv(x)

    layers = torch.nn.ModuleList([torch.nn.Identity(), Calls()])
    sys.modules["causal_conv1d"] = module
    try:
        watch = KernelWatch(layers)
        watch.run(lambda: layers[1](layers[0](torch.zeros(1))))
    finally:
        del sys.modules["causal_conv1d"]
    assert watch.seen["conv1d"] == {1: {"causal-conv1d ?"}}
    assert watch.record([0, 1]) == {
        "linear_attention": "not seen",
        "conv1d": {"not seen": [0], "causal-conv1d ?": [1]},
    }


def test_a_forward_that_ran_other_kernels_than_expected_stops_the_run():
    expected = {"attention": "sdpa", "linear_attention": "flash-linear-attention 0.6.0"}
    ran = {"attention": "sdpa", "linear_attention": "torch fallback"}
    with pytest.raises(HarnessError) as caught:
        require_as_expected(expected, ran)
    assert "linear_attention: expected flash-linear-attention 0.6.0, ran torch fallback" in str(
        caught.value
    )
    require_as_expected(ran, dict(ran))  # the same: nothing to say
