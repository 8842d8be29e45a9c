"""Checkpoint loading: formats, prefixes, config sources, strictness, refusals."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from dflash_eval.cli import main
from dflash_eval.drafter.loaders import load_drafter
from safetensors.torch import save_file

from .helpers import (
    LOADER_TARGET,
    load_error,
    same_weights,
    save_training_checkpoint,
)


@pytest.mark.parametrize("prefix", ["module.", "draft_model.", "module.draft_model.", ""])
def test_training_checkpoint_loads_with_prefix_removed(tmp_path, drafter, prefix):
    path = save_training_checkpoint(tmp_path / "step_500" / "checkpoint.pt", drafter, prefix=prefix)
    loaded = load_drafter(path, LOADER_TARGET)
    assert loaded.source.stripped_prefix == prefix
    assert loaded.source.step == 1000 and loaded.config_source == "checkpoint"
    assert loaded.warnings == []
    assert "optimizer_state_dict" in loaded.source.dropped_entries
    assert same_weights(loaded.model, drafter)


def test_missing_unexpected_and_misshaped_parameters_are_listed(tmp_path, drafter):
    state = dict(drafter.state_dict())
    del state["layers.1.mlp.up_proj.weight"]
    state["layers.0.self_attn.extra.weight"] = torch.zeros(2)
    state["layers.0.self_attn.q_proj.weight"] = torch.zeros(32, 64)
    path = save_training_checkpoint(tmp_path / "c.pt", drafter, state_dict=state)
    message = load_error(path)
    assert "missing (1): layers.1.mlp.up_proj.weight" in message
    assert "unexpected (1): layers.0.self_attn.extra.weight" in message
    assert "layers.0.self_attn.q_proj.weight (expected [64, 64], found [32, 64])" in message
    assert str(path) in message


def _with_config(tmp_path, drafter, **changes) -> Path:
    """A checkpoint of `drafter`'s weights whose config differs in `changes` only."""
    config = replace(drafter.config, **changes).to_hf_dict()
    path = tmp_path / "c.pt"
    return save_training_checkpoint(path, drafter, with_config=False, extra={"config": config})


def test_fc_input_size_mismatch_is_named(tmp_path, drafter):
    message = load_error(_with_config(tmp_path, drafter, target_layer_ids=(1, 2, 3)))
    assert "fc.weight" in message and "takes 128 input features" in message
    assert "= 192" in message


def test_every_mismatch_is_listed_at_once_with_a_wider_fc(tmp_path, drafter):
    """Missing, unexpected and a wider fc.weight together: all named in one message."""
    state = {k: v.clone() for k, v in drafter.state_dict().items()}
    del state["norm.weight"]
    state["layers.0.extra.weight"] = torch.zeros(3)
    state["fc.weight"] = torch.zeros(state["fc.weight"].shape[0], state["fc.weight"].shape[1] * 2)
    message = load_error(save_training_checkpoint(tmp_path / "c.pt", drafter, state_dict=state))
    assert "missing (1): norm.weight" in message
    assert "unexpected (1): layers.0.extra.weight" in message
    assert "fc.weight in" in message and "input features" in message


def test_a_text_file_as_checkpoint_is_one_clear_error(tmp_path):
    path = tmp_path / "checkpoint.pt"
    path.write_text("hello world\n")
    message = load_error(path)
    assert "Cannot read" in message and "as a torch checkpoint" in message


def test_mask_token_outside_target_vocab_stops(tmp_path, drafter):
    message = load_error(_with_config(tmp_path, drafter, mask_token_id=500))
    assert "mask_token_id 500 outside the target vocab" in message


def test_hidden_size_and_layer_ids_must_fit_target(tmp_path, drafter):
    message = load_error(_with_config(tmp_path, drafter, target_layer_ids=(1, 9)))
    assert "target_layer_ids [9] outside the target's 0..5" in message


def test_block_size_override_is_a_loud_warning(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter)
    loaded = load_drafter(path, LOADER_TARGET, block_size=4)
    assert loaded.config.block_size == 4 and loaded.trained_block_size == 6
    assert any(
        "differs from the block size the drafter was trained with (6)" in w for w in loaded.warnings
    )


def test_config_inferred_from_shapes_needs_block_size_and_mask(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter, with_config=False)
    assert "--mask-token-id" in load_error(path, block_size=6)
    assert "--block-size" in load_error(path, mask_token_id=3)
    loaded = load_drafter(
        path,
        LOADER_TARGET,
        block_size=6,
        mask_token_id=3,
        target_layer_ids=[1, 3],
        accept_default=["rope"],
    )
    assert loaded.config_source.startswith("inferred")
    assert loaded.config.target_layer_ids == (1, 3)
    assert same_weights(loaded.model, drafter)


def test_config_from_explicit_file_and_from_training_args(tmp_path, drafter):
    path = save_training_checkpoint(
        tmp_path / "c.pt",
        drafter,
        with_config=False,
        extra={"args": {"block_size": 6, "mask_token_id": 3}},
    )
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(drafter.config.to_hf_dict()))
    assert load_drafter(path, LOADER_TARGET, config_file=config_file).config == drafter.config
    from_args = load_drafter(path, LOADER_TARGET, target_layer_ids=[1, 3], accept_default=["rope"])
    assert from_args.config.block_size == 6 and from_args.config.mask_token_id == 3
    assert from_args.provenance()["block_size"] == "training args"


def test_borrowed_target_copies_are_set_aside_not_loaded(tmp_path, drafter):
    state = {**drafter.state_dict(), "embed_tokens.weight": torch.zeros(101, 64)}
    path = save_training_checkpoint(tmp_path / "c.pt", drafter, state_dict=state)
    assert load_drafter(path, LOADER_TARGET).ignored_parameters == ["embed_tokens.weight"]


def test_truncated_checkpoint_is_reported(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter)
    path.write_bytes(path.read_bytes()[:2000])
    assert "truncated" in load_error(path)


def test_hf_directory_loads(tmp_path, drafter):
    directory = tmp_path / "hf"
    directory.mkdir()
    save_file(
        {k: v.contiguous() for k, v in drafter.state_dict().items()},
        str(directory / "model.safetensors"),
    )
    (directory / "config.json").write_text(json.dumps(drafter.config.to_hf_dict()))
    loaded = load_drafter(directory, LOADER_TARGET)
    assert loaded.source.kind == "hf-directory" and loaded.config == drafter.config
    assert same_weights(loaded.model, drafter)


def test_extract_strips_optimizer_and_round_trips(tmp_path, drafter, capsys):
    checkpoint = save_training_checkpoint(
        tmp_path / "step_700" / "checkpoint.pt",
        drafter,
        step=700,
        extra={"optimizer_state_dict": {"state": {0: {"exp_avg": torch.zeros(200_000)}}}},
    )
    out = tmp_path / "extracted"
    assert main(["extract", "--checkpoint", str(checkpoint), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    done = json.loads(captured.out.strip().splitlines()[-1])
    assert done["event"] == "done"
    assert done["summary"]["size_after_bytes"] < done["summary"]["size_before_bytes"]
    assert "MB →" in captured.err
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "dflash_extract.json",
        "model.safetensors",
    ]
    loaded = load_drafter(out, LOADER_TARGET)
    assert loaded.source.kind == "extracted" and loaded.source.step == 700
    assert loaded.source.step_source == "extract provenance"
    assert same_weights(loaded.model, drafter)


def test_extract_replaces_only_its_own_output(tmp_path, drafter, capsys):
    checkpoint = save_training_checkpoint(tmp_path / "c.pt", drafter, step=5)
    out = tmp_path / "extracted"
    argv = ["extract", "--checkpoint", str(checkpoint), "--out", str(out)]
    assert main(argv) == 0
    (out / "model.safetensors").write_bytes(b"stale")
    assert main(argv) == 0  # its own earlier copy: replaced
    assert load_drafter(out, LOADER_TARGET).source.step == 5
    for mine in (out, out.with_name(out.name + ".partial")):
        shutil.rmtree(out)
        mine.mkdir()
        (mine / "notes.txt").write_text("kept")
        capsys.readouterr()
        assert main(argv) != 0
        assert f"{mine} exists and was not written by extract" in capsys.readouterr().err
        assert (mine / "notes.txt").read_text() == "kept"
        (mine / "notes.txt").unlink()  # an empty directory is no one's work: it is used
        assert main(argv) == 0


def test_flags_that_contradict_the_checkpoint_config_warn(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter)
    loaded = load_drafter(path, LOADER_TARGET, mask_token_id=4)
    assert loaded.config.mask_token_id == 4
    assert any("overrides the checkpoint config's 3" in w for w in loaded.warnings)
