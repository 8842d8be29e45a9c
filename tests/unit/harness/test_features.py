"""Target features you can trust: provenance, the fidelity guard, the CPU dtype rule, and
runs that find everything cached without loading the target's body."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from dflash_eval.contract.errors import HarnessError
from dflash_eval.reference.feature_set import FORMAT, INPUT_FIELDS, MANIFEST, read_feature_set
from dflash_eval.target.config import read_target_config
from dflash_eval.target.dtype import choose_target_dtype, parse_meminfo
from dflash_eval.target.features import FIDELITY_MAX_RELATIVE_ERROR, judge
from dflash_eval.target.parts import load_target_parts

from .helpers import (
    quick_eval,
    random_drafter,
    save_tiny_qwen3_5,
    save_training_checkpoint,
    small_config,
)

GIB = 2**30


def config_dir(directory, config) -> object:
    """A directory holding only `config` (a transformers config object) as config.json."""
    config.save_pretrained(str(directory))
    return directory


def qwen3_5_config(tmp_path):
    from transformers import Qwen3_5TextConfig

    text = Qwen3_5TextConfig(num_hidden_layers=4, hidden_size=64, num_attention_heads=4)
    return read_target_config(config_dir(tmp_path / "qwen3_5", text))


def qwen3_config(tmp_path, **values):
    from transformers import Qwen3Config

    text = Qwen3Config(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, **values)
    return read_target_config(config_dir(tmp_path / "qwen3", text))


def _qwen3_5_eval(lab, tmp_path, target_dir, **overrides):
    drafter = random_drafter(small_config(target_layer_ids=(1, 2), mask_token_id=3))
    checkpoint = save_training_checkpoint(tmp_path / "checkpoint.pt", drafter)
    return quick_eval(
        lab, tmp_path, checkpoint=checkpoint, target=target_dir, max_new_tokens=10, **overrides
    )


def test_bf16_features_of_a_linear_attention_target_are_measured_against_float32(lab, tmp_path):
    target_dir = save_tiny_qwen3_5(tmp_path / "target", lab.target_dir, 101, False)
    results = _qwen3_5_eval(lab, tmp_path, target_dir, target_dtype="bfloat16")
    features = results["features"]
    assert features["device"] == "cpu" and features["dtype"] == "bfloat16"
    assert features["dtype_source"] == "--target-dtype"
    assert features["kernel"] == {
        "attention": "sdpa",
        "linear_attention": "torch fallback",
        "conv1d": "torch fallback",
    }
    assert features["libraries"]["transformers"] and features["host"]
    fidelity = features["fidelity"]
    assert fidelity["status"] == "measured"
    layers = fidelity["layers"]
    assert set(layers) == {"1", "2"}
    errors = [row["relative_error"] for row in layers.values()]
    # bf16 rounding is real drift: non-zero, below the bound here, different per layer.
    assert all(0 < e < FIDELITY_MAX_RELATIVE_ERROR for e in errors)
    assert errors[0] != errors[1]
    assert all(0.99 < row["cosine_min"] < 1 for row in layers.values())


def test_fidelity_differs_between_targets(lab, tmp_path):
    measured = []
    for seed in (0, 1):
        target_dir = save_tiny_qwen3_5(tmp_path / f"t{seed}", lab.target_dir, 101, False, seed)
        run_dir = tmp_path / f"run{seed}"
        results = _qwen3_5_eval(lab, run_dir, target_dir, target_dtype="bfloat16")
        measured.append(results["features"]["fidelity"]["layers"])
    assert measured[0] != measured[1]


def test_linear_attention_targets_saved_in_bf16_default_to_float32_on_cpu(lab, tmp_path):
    target_dir = save_tiny_qwen3_5(
        tmp_path / "target", lab.target_dir, 101, False, dtype=torch.bfloat16
    )
    assert json.loads((target_dir / "config.json").read_text())["dtype"] == "bfloat16"
    results = _qwen3_5_eval(lab, tmp_path, target_dir)
    assert results["target"]["dtype"] == "float32"
    assert results["features"]["dtype_source"] == "auto: float32 for linear attention on CPU"
    assert results["features"]["fidelity"]["status"] == "not needed"
    assert not [w for w in results["warnings"] if w.startswith("features")]


def test_float32_is_refused_with_advice_when_memory_is_short(tmp_path):
    hybrid, plain = qwen3_5_config(tmp_path), qwen3_config(tmp_path)
    chosen = choose_target_dtype("auto", "bfloat16", hybrid, 54 * GIB, 200 * GIB)
    assert chosen.name == "float32"
    with pytest.raises(HarnessError, match=r"features host.*--target-dtype bfloat16"):
        choose_target_dtype("auto", "bfloat16", hybrid, 54 * GIB, 100 * GIB)
    # An explicit dtype, or a target without linear attention, is taken as it is.
    assert choose_target_dtype("bfloat16", "bfloat16", hybrid, 54 * GIB, GIB).name == "bfloat16"
    assert choose_target_dtype("auto", "bfloat16", plain, 54 * GIB, GIB).name == "bfloat16"


def test_meminfo_is_read_in_bytes():
    text = "MemTotal:       24000000 kB\nMemAvailable:   12345678 kB\n"
    assert parse_meminfo(text) == 12345678 * 1024
    assert parse_meminfo("MemTotal: 1 kB\n") is None


def test_features_beyond_the_bounds_are_named_layer_by_layer():
    rows = {
        "1": {"relative_error": 0.30, "cosine_mean": 0.95, "cosine_min": 0.80},
        "9": {"relative_error": 0.001, "cosine_mean": 1.0, "cosine_min": 0.9999},
    }
    found = judge(rows)
    assert len(found) == 1 and found[0].startswith("target layer 1:")


def test_a_fully_cached_run_reads_only_the_embedding_and_head(lab, tmp_path):
    first = quick_eval(lab, tmp_path)
    assert first["features"]["target_load"] == {"body_loaded": True, "tensors_read": "all"}
    second = quick_eval(lab, tmp_path)
    assert second["features"]["target_load"] == {
        "body_loaded": False,
        "tensors_read": [
            "model.safetensors:model.embed_tokens.weight",
            "model.safetensors:lm_head.weight",
        ],
    }
    assert second["features"]["cache"] == {
        "completion_hits": 3,
        "hidden_state_hits": 3,
        "prompts": 3,
    }
    assert second["metrics"] == first["metrics"]
    for name in ("host", "device", "dtype", "kernel", "fidelity"):
        assert second["features"][name] == first["features"][name]


def test_the_cache_key_of_hidden_states_names_device_dtype_and_kernel(lab, tmp_path):
    quick_eval(lab, tmp_path)
    entry = next((tmp_path / "cache" / "features").glob("*.json"))
    key = json.loads(entry.read_text())["key"]
    assert key["device"] == "cpu" and key["target_dtype"] == "torch.float32"
    assert key["kernel"] == {"attention": "sdpa"}


def test_the_wrapper_embedding_is_found_under_its_language_model(lab, tmp_path):
    target_dir = save_tiny_qwen3_5(tmp_path / "target", lab.target_dir, 101, True)
    parts = load_target_parts(target_dir, read_target_config(target_dir), torch.float32)
    assert parts.tensors_read == [
        "model.safetensors:model.language_model.embed_tokens.weight",
        "model.safetensors:lm_head.weight",
    ]
    cached_twice = [_qwen3_5_eval(lab, tmp_path, target_dir) for _ in range(2)]
    assert not cached_twice[1]["features"]["target_load"]["body_loaded"]
    assert cached_twice[1]["metrics"] == cached_twice[0]["metrics"]


def test_tied_embeddings_are_read_once(tmp_path):
    from safetensors.torch import save_file

    embed = torch.randn(11, 4)
    tied = qwen3_config(tmp_path, tie_word_embeddings=True)
    save_file({"model.embed_tokens.weight": embed}, tied.path / "model.safetensors")
    parts = load_target_parts(tied.path, tied, torch.bfloat16)
    assert parts.tensors_read == ["model.safetensors:model.embed_tokens.weight"]
    assert parts.head_weight is parts.embed_weight
    assert torch.equal(parts.embed_weight, embed.to(torch.bfloat16))


def test_the_staging_manifest_sha256_is_trusted_only_while_it_describes_the_file(tmp_path):
    import os

    from dflash_eval.run.results import file_identity
    from dflash_eval.target.files import sha256_file

    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"weights" * 100)
    manifest = tmp_path / "checkpoint.pt.manifest.json"
    recorded = "ab" * 32  # not the file's hash: proves the manifest, not the bytes, was read
    manifest.write_text(json.dumps({"size": 700, "sha256": recorded}))
    os.utime(checkpoint, ns=(1_000_000_000, 1_000_000_000))
    trusted = file_identity([checkpoint], verify=False)
    assert (trusted["sha256"], trusted["sha256_source"]) == (recorded, "staging manifest")
    verified = file_identity([checkpoint], verify=True)
    assert (verified["sha256"], verified["sha256_source"]) == (sha256_file(checkpoint), "hashed")
    later = manifest.stat().st_mtime_ns + 1_000_000_000
    os.utime(checkpoint, ns=(later, later))  # rewritten after staging: hash it
    assert file_identity([checkpoint], verify=False)["sha256_source"] == "hashed"
    manifest.write_text(json.dumps({"size": 699, "sha256": recorded}))
    os.utime(checkpoint, ns=(1_000_000_000, 1_000_000_000))
    assert file_identity([checkpoint], verify=False)["sha256_source"] == "hashed"


def test_run_eval_passes_verify_under_the_harness_flag():
    from dflash_eval.contract.parser import build_parser

    from dflash_ops.evaluation.harness_options import harness_args

    argv = harness_args({"verify": True})
    assert argv == ["--verify"]
    parsed = build_parser().parse_args(
        ["eval", "--checkpoint", "c", "--target", "t", "--out", "o", *argv]
    )
    assert parsed.verify


def test_a_run_on_a_feature_set_records_the_sha256_of_the_feature_set_json_it_read(tmp_path):
    """The workstation checks it against its own record of the set (set_anchors)."""
    manifest = {name: None for name in INPUT_FIELDS} | {"format": FORMAT, "entries": 0}
    manifest |= {"provenance": {"host": "gpu"}, "fidelity": {"status": "not needed"}}
    data = (json.dumps(manifest, indent=1) + "\n").encode()
    setdir = tmp_path / "tiny-0123456789ab"
    setdir.mkdir()
    (setdir / MANIFEST).write_bytes(data)
    record = read_feature_set(setdir).features_record()
    assert record["set"] == setdir.name
    assert record["set_sha256"] == hashlib.sha256(data).hexdigest()
