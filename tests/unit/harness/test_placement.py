"""A target split over several devices (target/placement.py): the plan, and a load through it.

No GPU here: the plan is a pure function of module sizes, devices and the cap, checked on
made-up sizes and on a real tiny hybrid model's; the load goes through transformers'
`device_map` path (accelerate's dispatch) with every planned device being the CPU, and its
features must equal the plain load's. scripts/gpu_check.py runs the same load over real GPUs.
"""

from __future__ import annotations

import pytest
import torch
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.progress import Progress
from dflash_eval.run.features import FeaturesOptions, run_features
from dflash_eval.target.config import read_target_config
from dflash_eval.target.model import load_target, plan_placement, text_skeleton
from dflash_eval.target.placement import Shard, Unit, plan

from .helpers import save_tiny_qwen3_5

GIB = 2**30


def _units(sizes: list[int]) -> list[Unit]:
    """An embedding, len(sizes) − 2 layers and a head, of these sizes in GiB."""
    made = [Unit(("model.embed_tokens",), sizes[0] * GIB)]
    made += [Unit((f"model.layers.{i}",), s * GIB, i) for i, s in enumerate(sizes[1:-1])]
    return [*made, Unit(("model.norm", "lm_head"), sizes[-1] * GIB)]


def test_layers_are_spread_in_order_in_about_equal_shares():
    placement = plan(_units([2] + [1] * 12 + [2]), ["cuda:0", "cuda:1", "cuda:2", "cuda:3"], None)
    assert placement.layers == {
        "cuda:0": [0, 1],
        "cuda:1": [2, 5],
        "cuda:2": [6, 9],
        "cuda:3": [10, 11],
    }
    assert placement.weight_bytes == {d: 4 * GIB for d in placement.devices}
    assert placement.device_map["model.embed_tokens"] == "cuda:0"
    assert placement.device_map["lm_head"] == placement.device_map["model.norm"] == "cuda:3"


def test_a_cap_below_the_equal_share_fills_each_device_up_to_the_cap():
    # 16 GiB over 2 devices of 10 GiB: equal shares (8 each) fit; 3 devices of 6: they do too.
    assert max(plan(_units([2] + [1] * 12 + [2]), ["a", "b"], 10 * GIB).weight_bytes.values()) <= (
        10 * GIB
    )
    skewed = _units([1, 5, 1, 1, 1, 5, 1])  # equal shares of 5 put 6 on a device
    placement = plan(skewed, ["a", "b", "c"], 6 * GIB)
    assert max(placement.weight_bytes.values()) <= 6 * GIB
    assert sum(placement.weight_bytes.values()) == 15 * GIB


def test_weights_that_cannot_fit_under_the_caps_are_refused_with_the_sizes():
    with pytest.raises(HarnessError) as caught:
        plan(_units([2] + [1] * 12 + [2]), ["cuda:0", "cuda:1"], 7 * GIB)
    message = str(caught.value)
    assert "16.00 GiB" in message and "2 GPU(s) at 7.00 GiB" in message
    assert "gpu_memory" in message


def test_every_weight_of_a_real_hybrid_model_has_a_planned_device(lab, tmp_path):
    target_dir = save_tiny_qwen3_5(tmp_path / "t", lab.target_dir, 101, wrapper=True)
    config = read_target_config(target_dir)
    skeleton = text_skeleton(config, torch.float32)
    placement = plan_placement(config, torch.float32, Shard(("cuda:0", "cuda:1")))
    names = [name for name, _ in skeleton.named_parameters()]
    covered = [n for n in names if any(n.startswith(m + ".") for m in placement.device_map)]
    assert covered == names
    assert sum(placement.weight_bytes.values()) == 4 * sum(p.numel() for p in skeleton.parameters())
    assert placement.layers == {"cuda:0": [0, 1], "cuda:1": [2, 3]}
    # The rotary table runs before the first layer: with the embedding; the head after the last.
    assert placement.device_map["model.rotary_emb"] == placement.device_map["model.embed_tokens"]
    assert placement.device_map["lm_head"] == placement.device_map["model.norm"] == "cuda:1"


def test_sharding_on_the_cpu_is_refused_before_anything_loads(lab, tmp_path):
    options = FeaturesOptions(
        target=lab.target_dir,
        out=tmp_path / "set",
        layers=[1],
        block_size=4,
        device="cpu",
        shard_gpus=True,
    )
    with pytest.raises(HarnessError, match=r"--shard-gpus splits the target over GPUs, but"):
        run_features(options, Progress(quiet=True))


def test_a_sharded_load_gives_the_features_of_a_plain_load(lab, tmp_path):
    target_dir = save_tiny_qwen3_5(tmp_path / "t", lab.target_dir, 101, wrapper=False)
    tokens = list(range(5, 40))
    plain = load_target(target_dir, "float32")
    sharded = load_target(target_dir, "float32", shard=Shard(("cpu", "cpu", "cpu")))
    assert sharded.placement is not None
    assert sharded.placement.record()["layers"] == {"cpu": [0, 3]}
    expected = plain.hidden_features(tokens, [1, 3])
    found = sharded.hidden_features(tokens, [1, 3])
    for layer in (1, 3):
        torch.testing.assert_close(found[layer], expected[layer], rtol=0, atol=0)
