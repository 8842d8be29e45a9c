"""What a feature set is made of, without a lab: its id, the rule that picks its layers and
block size, the inventory's features hosts, and which relayed set `run-eval --features`
picks (dflash_ops.features.spec and .hosted, core.inventory)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dflash_ops.core.errors import OpsError
from dflash_ops.core.inventory import parse
from dflash_ops.features.spec import FeatureRequest, choose_layers, parse_layers, set_id
from dflash_ops.remote.relayed_sets import parse_relayed_sets, pick_set
from tests.inventory_documents import features_host, minimal_document


def test_the_set_id_names_every_input_and_nothing_else():
    base = FeatureRequest(layers=(1, 3), block_size=8, max_new_tokens=24)
    first = set_id(base, "tiny-target", "f" * 64)
    assert first == set_id(base, "tiny-target", "f" * 64)
    assert first.startswith("tiny-target-") and len(first) == len("tiny-target-") + 12
    changed = [
        set_id(
            FeatureRequest(layers=(1, 4), block_size=8, max_new_tokens=24), "tiny-target", "f" * 64
        ),
        set_id(
            FeatureRequest(layers=(1, 3), block_size=16, max_new_tokens=24), "tiny-target", "f" * 64
        ),
        set_id(
            FeatureRequest(layers=(1, 3), block_size=8, max_new_tokens=25), "tiny-target", "f" * 64
        ),
        set_id(
            FeatureRequest(layers=(1, 3), block_size=8, max_new_tokens=24, thinking=True),
            "tiny-target",
            "f" * 64,
        ),
        set_id(base, "tiny-target", "e" * 64),
    ]
    assert len({first, *changed}) == 6

    # what changes the numbers counts (dtype, device, completions' source); threads do not
    def variant(**how) -> str:
        request = FeatureRequest(layers=(1, 3), block_size=8, max_new_tokens=24, **how)
        return set_id(request, "tiny-target", "f" * 64)

    assert variant(threads=3) == first
    assert variant(target_dtype="auto", device="auto") == first  # auto is the default asked
    how = [variant(target_dtype="float32"), variant(device="cuda"), variant(sglang=True)]
    assert len({first, *how}) == 4


def test_the_set_id_follows_the_prompt_file_bytes(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a"}\n')
    request = FeatureRequest(layers=(1,), block_size=4, prompts=prompts)
    before = set_id(request, "t", "0" * 64)
    prompts.write_text('{"prompt": "b"}\n')
    assert set_id(request, "t", "0" * 64) != before
    assert set_id(FeatureRequest(layers=(1,), block_size=4), "t", "0" * 64) != before


def _inventory(tmp_path: Path, drafter: dict | None = None):
    raw = minimal_document(**({} if drafter is None else {"drafter": drafter}))
    return parse(raw, tmp_path / "inventory.yaml")


def _with_features_host(tmp_path: Path, **gpu):
    raw = minimal_document()
    raw["hosts"]["gpu"] = features_host(**gpu)
    return parse(raw, tmp_path / "inventory.yaml")


def test_layers_come_from_the_flags_else_the_drafter_profile_else_an_error(tmp_path):
    bare = _inventory(tmp_path)
    assert choose_layers(bare, "1,9,17", 16) == ((1, 9, 17), 16)
    with pytest.raises(OpsError, match=r"--layers and --block-size not known.*drafter profile"):
        choose_layers(bare, None, None)
    with pytest.raises(OpsError, match=r"--block-size not known"):
        choose_layers(bare, "1,2", None)
    profiled = _inventory(tmp_path, {"target_layer_ids": [2, 5], "block_size": 8})
    assert choose_layers(profiled, None, None) == ((2, 5), 8)
    assert choose_layers(profiled, "3", None) == ((3,), 8)  # a flag wins over the profile
    config = tmp_path / "dflash.json"
    config.write_text(json.dumps({"block_size": 16, "dflash_config": {"target_layer_ids": [1, 4]}}))
    from_file = _inventory(tmp_path, {"config_file": "dflash.json"})
    assert choose_layers(from_file, None, None) == ((1, 4), 16)


@pytest.mark.parametrize("text", ["", "1,x", "-1", "2,2"])
def test_bad_layers_are_refused(text):
    with pytest.raises(OpsError, match="--layers"):
        parse_layers(text)


@pytest.mark.parametrize(
    ("options", "prompts", "dataset", "message"),
    [
        ({"thinking": "yes"}, None, None, "--thinking: expected one of on, off, found 'yes'"),
        ({"target_dtype": "fp16"}, None, None, "--target-dtype: expected one of auto, float32"),
        ({"threads": "0"}, None, None, "--threads: expected a whole number from 1 to 4096 threads"),
        (
            {"block_size": "1"},
            None,
            None,
            "--block-size: expected a whole number from 2 to 1024 tokens",
        ),
        ({"num_prompts": "2"}, None, None, "--num-prompts draws from each --dataset set"),
        ({}, "nowhere.jsonl", None, "--prompts: nowhere.jsonl is not a file"),
        ({}, "p.jsonl", "gsm8k", "--dataset and --prompts both name the prompts"),
    ],
)
def test_extract_features_checks_run_eval_s_options_as_run_eval_does(
    tmp_path, options, prompts, dataset, message
):
    """The same table and prompts rule as run-eval (harness_options, request.prompts_file), before
    any host is asked anything: this inventory has no features host at all."""
    from dflash_ops.ui.features_commands import extract_features_command

    with pytest.raises(OpsError, match=re.escape(message)):
        extract_features_command(
            _inventory(tmp_path, {"target_layer_ids": [1], "block_size": 4}),
            on=None,
            prompts=prompts,
            dataset=dataset,
            harness_options=options,
            layers=None,
            device=None,
            to=None,
            verify=False,
        )


def test_a_features_host_with_fla_gets_the_package_in_its_venv(tmp_path):
    inventory = _inventory(tmp_path)
    raw = {
        "hosts": {
            **{name: host.model_dump(exclude_none=True) for name, host in inventory.hosts.items()},
            "gpu": {
                "role": "features",
                "address": "g",
                "workdir": "/w",
                "venv": {"path": "/v", "torch": "cuda"},
                "target_model": "/m",
                "fla": True,
            },
        }
    }
    parsed = parse(raw, tmp_path / "inventory.yaml")
    assert parsed.hosts["gpu"].venv.packages == ["flash-linear-attention", "causal-conv1d"]
    assert list(parsed.eval_hosts) == ["eval"] and list(parsed.features_hosts) == ["gpu"]
    assert list(parsed.harness_hosts) == ["eval", "gpu"]


def test_without_a_features_host_extract_features_says_what_to_add(tmp_path):
    with pytest.raises(OpsError, match=r"no host with role: features; add one"):
        _inventory(tmp_path).features_host(None)


def test_run_eval_picks_the_named_set_or_the_last_relayed():
    listing = "1700000100 tiny-b\n1700000000 tiny-a\nnot a line\n\n1700000100 tiny-c\n"
    sets = parse_relayed_sets(listing)
    assert sets == {"tiny-a": 1700000000, "tiny-b": 1700000100, "tiny-c": 1700000100}
    assert pick_set(sets, "tiny-a") == "tiny-a"
    assert pick_set(sets, "latest") == "tiny-c"  # same second: the later name, deterministic
    assert pick_set(sets, "tiny-z") is None
    assert pick_set({}, "latest") is None


def test_fla_adds_its_package_once_and_only_when_asked(tmp_path):
    assert _with_features_host(tmp_path).hosts["gpu"].venv.packages == []
    assert _with_features_host(tmp_path, fla=False).hosts["gpu"].venv.packages == []
    pinned = {"path": "/v", "packages": ["numpy<3", "flash-linear-attention==0.3.2"]}
    kept = _with_features_host(tmp_path, fla=True, venv=pinned).hosts["gpu"].venv.packages
    assert kept == ["numpy<3", "flash-linear-attention==0.3.2", "causal-conv1d"]
    added = {"path": "/v", "packages": ["numpy<3"]}
    grown = _with_features_host(tmp_path, fla=True, venv=added).hosts["gpu"].venv.packages
    assert grown == ["numpy<3", "flash-linear-attention", "causal-conv1d"]


def test_fla_with_a_malformed_venv_leaves_the_venv_s_own_error(tmp_path):
    with pytest.raises(OpsError, match=r"hosts\.gpu\.venv"):
        _with_features_host(tmp_path, fla=True, venv="/v")
    with pytest.raises(OpsError, match=r"hosts\.gpu\.venv\.packages"):
        _with_features_host(tmp_path, fla=True, venv={"path": "/v", "packages": "numpy"})


def test_a_features_host_is_found_by_name_among_the_harness_hosts(tmp_path):
    inventory = _with_features_host(tmp_path)
    name, host = inventory.features_host("gpu")
    assert (name, host) == ("gpu", inventory.hosts["gpu"])
    assert inventory.features_host(None) == (name, host)  # the only one
    assert inventory.harness_host("gpu") == (name, host)
    assert inventory.harness_host("eval") == ("eval", inventory.hosts["eval"])
