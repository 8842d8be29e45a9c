"""The checkpoint format matrix and the loader's diagnostics, one case each.

Every checkpoint here states its target_layer_ids explicitly (in its config or in the
--drafter-config file), so nothing depends on the default layer rule.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from pathlib import Path

import pytest
import torch
from dflash_eval.drafter.checkpoint import read_drafter, strip_prefix
from dflash_eval.drafter.loaders import load_drafter
from dflash_eval.drafter.pickle_policy import PicklePolicy
from dflash_eval.drafter.torch_reader import TORCH_READER
from safetensors.torch import save_file

from .helpers import (
    LOADER_TARGET,
    load_error,
    random_drafter,
    same_weights,
    save_training_checkpoint,
    small_config,
)

SAFE_ARGPARSE = PicklePolicy(safe_globals=("argparse",))
UNSAFE = PicklePolicy(allow_unsafe=True)


def config_file(tmp_path: Path, drafter, **changes) -> Path:
    config = drafter.config.to_hf_dict()
    config.update(changes)
    path = tmp_path / "drafter-config.json"
    path.write_text(json.dumps(config))
    return path


def config_without_block_and_mask(drafter) -> dict:
    config = drafter.config.to_hf_dict()
    del config["block_size"]
    del config["dflash_config"]["mask_token_id"]
    return config


class ConfigObject:
    """What transformers' config classes look like to the loader: an object with to_dict()."""

    def __init__(self, values: dict) -> None:
        self.values = values

    def to_dict(self) -> dict:
        return dict(self.values)


class CreatesFile:
    """Unpickling this calls Path.touch: what a malicious checkpoint could do."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


# --- formats ------------------------------------------------------------------------------


def test_a_clean_training_checkpoint_loads_without_warnings_or_notes(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter)
    loaded = load_drafter(path, LOADER_TARGET)
    assert loaded.warnings == [] and loaded.notes == [] and loaded.ignored_parameters == []
    assert loaded.config == drafter.config and loaded.trained_block_size == 6
    assert loaded.source.kind == "training-checkpoint" and loaded.source.files == [path]
    assert loaded.source.dropped_entries == ["optimizer_state_dict"]
    assert loaded.source.step_source == "checkpoint 'step'"
    assert same_weights(loaded.model, drafter)


def test_a_plain_state_dict_loads_with_a_config_file_and_the_step_from_its_path(tmp_path, drafter):
    path = tmp_path / "step_1234" / "weights.pt"
    path.parent.mkdir()
    torch.save({f"module.{k}": v for k, v in drafter.state_dict().items()}, path)
    loaded = load_drafter(path, LOADER_TARGET, config_file=config_file(tmp_path, drafter))
    assert loaded.warnings == [] and loaded.config == drafter.config
    assert loaded.config_source == f"file {tmp_path / 'drafter-config.json'}"
    assert (loaded.source.step, loaded.source.step_source) == (1234, "path")
    assert loaded.source.stripped_prefix == "module." and loaded.source.dropped_entries == []
    assert same_weights(loaded.model, drafter)


@pytest.mark.parametrize(
    ("name", "step"), [("checkpoint-2500/x.pt", 2500), ("step2600.pt", 2600), ("final.pt", None)]
)
def test_the_step_is_read_from_the_path_when_the_checkpoint_has_none(tmp_path, drafter, name, step):
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    checkpoint = {"model_state_dict": drafter.state_dict(), "config": drafter.config.to_hf_dict()}
    torch.save(checkpoint, path)
    source = read_drafter(path, TORCH_READER)
    assert source.step == step
    assert source.step_source == ("path" if step is not None else None)


def test_global_step_is_used_when_there_is_no_step(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter, extra={"global_step": 77})
    torch.save({k: v for k, v in torch.load(path).items() if k != "step"}, path)
    source = read_drafter(path, TORCH_READER)
    assert (source.step, source.step_source) == (77, "checkpoint 'global_step'")


@pytest.mark.parametrize("key", ["state_dict", "model"])
def test_other_state_dict_keys_are_found(tmp_path, drafter, key):
    path = tmp_path / "c.pt"
    torch.save({key: drafter.state_dict(), "config": drafter.config.to_hf_dict()}, path)
    loaded = load_drafter(path, LOADER_TARGET)
    assert loaded.warnings == [] and same_weights(loaded.model, drafter)


def test_args_as_a_json_string_give_block_size_and_mask_id(tmp_path, drafter):
    args = json.dumps({"block_size": 6, "mask_token_id": 3, "lr": 1e-4})
    path = save_training_checkpoint(
        tmp_path / "c.pt",
        drafter,
        with_config=False,
        extra={"config": config_without_block_and_mask(drafter), "args": args},
    )
    loaded = load_drafter(path, LOADER_TARGET)
    assert loaded.config == drafter.config and loaded.warnings == []
    assert loaded.trained_block_size == 6
    assert "block_size 6 from the training args" in loaded.notes
    assert loaded.source.extra_hints == {"block_size": 6, "mask_token_id": 3}


@pytest.mark.parametrize(
    ("args", "policy"),
    [
        (argparse.Namespace(block_size=6, mask_token_id=3, seed=1), SAFE_ARGPARSE),
        (ConfigObject({"block_size": 6, "mask_token_id": 3}), UNSAFE),
    ],
    ids=["namespace", "to_dict"],
)
def test_args_as_objects_give_block_size_and_mask_id(tmp_path, drafter, args, policy):
    path = save_training_checkpoint(
        tmp_path / "c.pt",
        drafter,
        with_config=False,
        extra={"config": config_without_block_and_mask(drafter), "args": args},
    )
    # Objects are not plain weights: reading them is the user's explicit choice.
    loaded = load_drafter(path, LOADER_TARGET, pickle_policy=policy)
    assert loaded.config == drafter.config and loaded.warnings == []
    assert loaded.source.extra_hints == {"block_size": 6, "mask_token_id": 3}


def test_unparseable_or_empty_args_give_no_hints(tmp_path, drafter):
    for args in ("not json", json.dumps({"block_size": None})):
        path = save_training_checkpoint(tmp_path / "c.pt", drafter, extra={"args": args})
        assert read_drafter(path, TORCH_READER).extra_hints == {}


@pytest.mark.parametrize("key", ["config", "model_config", "draft_config"])
def test_config_as_an_object_or_json_under_any_config_key(tmp_path, drafter, key):
    hf = drafter.config.to_hf_dict()
    for value, policy in ((ConfigObject(hf), UNSAFE), (json.dumps(hf), None)):
        path = save_training_checkpoint(
            tmp_path / "c.pt", drafter, with_config=False, extra={key: value}
        )
        loaded = load_drafter(path, LOADER_TARGET, pickle_policy=policy)
        assert loaded.config == drafter.config and loaded.config_source == "checkpoint"


def test_a_config_entry_without_hidden_size_is_not_taken_for_the_config(tmp_path, drafter):
    path = save_training_checkpoint(
        tmp_path / "c.pt", drafter, with_config=False, extra={"config": {"lr": 1}}
    )
    assert read_drafter(path, TORCH_READER).config_dict is None


def test_a_directory_holding_one_checkpoint_reads_it(tmp_path, drafter):
    directory = tmp_path / "run"
    path = save_training_checkpoint(directory / "last.pt", drafter)
    loaded = load_drafter(directory, LOADER_TARGET)
    assert loaded.source.path == path and loaded.source.kind == "training-checkpoint"
    assert loaded.warnings == [] and same_weights(loaded.model, drafter)


def test_a_directory_with_two_or_no_checkpoints_is_refused_with_their_names(tmp_path, drafter):
    directory = tmp_path / "run"
    directory.mkdir()
    assert "found []" in load_error(directory)
    save_training_checkpoint(directory / "a.pt", drafter)
    save_training_checkpoint(directory / "b.pth", drafter)
    message = load_error(directory)
    assert "not exactly one *.pt" in message and "'a.pt', 'b.pth'" in message


def test_an_old_format_checkpoint_loads(tmp_path, drafter):
    path = tmp_path / "old.pt"
    checkpoint = {"model_state_dict": drafter.state_dict(), "config": drafter.config.to_hf_dict()}
    torch.save(checkpoint, path, _use_new_zipfile_serialization=False)
    loaded = load_drafter(path, LOADER_TARGET)
    assert loaded.warnings == [] and same_weights(loaded.model, drafter)


def test_a_malicious_old_format_pickle_is_still_refused(tmp_path, drafter):
    marker = tmp_path / "pwned"
    path = tmp_path / "old.pt"
    checkpoint = {
        "model_state_dict": drafter.state_dict(),
        "config": drafter.config.to_hf_dict(),
        "payload": CreatesFile(marker),
    }
    torch.save(checkpoint, path, _use_new_zipfile_serialization=False)
    message = load_error(path)
    assert "Refusing to load" in message and "--allow-unsafe-pickle" in message
    assert not marker.exists()


def test_a_pickle_that_is_not_a_dict_is_refused(tmp_path, drafter):
    path = tmp_path / "c.pt"
    torch.save(list(drafter.state_dict().values()), path)
    assert "unpickles to a list, not a dict" in load_error(path)


def test_non_tensor_entries_in_the_state_dict_are_refused(tmp_path, drafter):
    state = {**drafter.state_dict(), "layers.0.note": 3}
    path = tmp_path / "c.pt"
    torch.save({"model_state_dict": state, "config": drafter.config.to_hf_dict()}, path)
    assert "non-tensor entries: ['layers.0.note']" in load_error(path)


def test_a_dict_without_parameters_names_its_keys(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"epoch": 3, "weights": torch.zeros(2), "lr": 0.1}, path)
    message = load_error(path)
    assert "has no parameters under" in message and "['epoch', 'lr', 'weights']" in message
    torch.save({}, path)
    assert "has no parameters under" in load_error(path)


def test_a_missing_path_says_to_stage_it(tmp_path):
    message = load_error(tmp_path / "step_9" / "checkpoint.pt")
    assert "does not exist" in message and "stage the checkpoint" in message


def test_a_path_given_as_text_is_read_like_a_path(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "step_5" / "checkpoint.pt", drafter)
    source = read_drafter(str(path), TORCH_READER)
    assert source.path == path and source.files == [path] and source.step == 1000


@pytest.mark.parametrize("data", [b"", b"PK\x03\x04" + b"x" * 100], ids=["empty", "broken-zip"])
def test_a_file_that_is_no_checkpoint_is_reported_with_its_size(tmp_path, data):
    path = tmp_path / "c.pt"
    path.write_bytes(data)
    message = load_error(path)
    assert f"({len(data)} bytes)" in message and "truncated or not a checkpoint" in message


def test_text_that_is_no_pickle_is_reported_as_no_checkpoint(tmp_path):
    path = tmp_path / "c.pt"
    path.write_bytes(b"hello world\n" * 10)
    assert "truncated or not a checkpoint" in load_error(path)


@pytest.mark.parametrize("policy", [None, UNSAFE], ids=["weights-only", "unsafe-allowed"])
def test_zero_bytes_are_reported_as_no_checkpoint(tmp_path, policy):
    """A file of zero bytes (space allocated, never written) stops the weights-only unpickler
    at an "operand" that is no pickle opcode: a damaged file, not one that wants code."""
    path = tmp_path / "c.pt"
    path.write_bytes(bytes(123))
    message = load_error(path, pickle_policy=policy)
    assert f"Cannot read {path} (123 bytes, beginning with zero bytes only)" in message
    assert "byte 0x00 is not a pickle opcode" in message
    assert "truncated or not a checkpoint" in message and "Refusing" not in message


def test_garbage_after_a_valid_pickle_start_is_no_checkpoint_either(tmp_path):
    path = tmp_path / "c.pt"
    path.write_bytes(b"\x80\x02" + bytes([0xFF]) * 40)
    message = load_error(path)
    assert "byte 0xff is not a pickle opcode" in message and "zero bytes" not in message


def test_hf_directory_of_several_shards_and_its_step_from_the_path(tmp_path, drafter):
    directory = tmp_path / "step_800"
    directory.mkdir()
    state = {k: v.contiguous() for k, v in drafter.state_dict().items()}
    names = sorted(state)
    save_file({k: state[k] for k in names[:5]}, str(directory / "a.safetensors"))
    save_file({k: state[k] for k in names[5:]}, str(directory / "b.safetensors"))
    (directory / "config.json").write_text(json.dumps(drafter.config.to_hf_dict()))
    loaded = load_drafter(directory, LOADER_TARGET)
    assert loaded.source.kind == "hf-directory" and loaded.warnings == []
    assert (loaded.source.step, loaded.source.step_source) == (800, "path")
    assert [p.name for p in loaded.source.files] == [
        "a.safetensors",
        "b.safetensors",
        "config.json",
    ]
    assert same_weights(loaded.model, drafter)


def test_a_truncated_safetensors_file_is_named(tmp_path, drafter):
    directory = tmp_path / "hf"
    directory.mkdir()
    file = directory / "model.safetensors"
    save_file({k: v.contiguous() for k, v in drafter.state_dict().items()}, str(file))
    file.write_bytes(file.read_bytes()[:100])
    assert f"Cannot read {file} as safetensors" in load_error(directory)


# --- prefixes and borrowed parameters -------------------------------------------------------


def test_prefixes_are_stripped_only_when_every_name_has_them():
    tensor = torch.zeros(1)
    assert strip_prefix({"_orig_mod.model.a": tensor, "_orig_mod.model.b": tensor}) == (
        "_orig_mod.model.",
        {"a": tensor, "b": tensor},
    )
    assert strip_prefix({"module.a": tensor, "b": tensor}) == (
        "",
        {"module.a": tensor, "b": tensor},
    )
    assert strip_prefix({}) == ("", {})


def test_borrowed_head_and_rotary_buffers_are_set_aside(tmp_path, drafter):
    state = {
        **drafter.state_dict(),
        "lm_head.weight": torch.zeros(101, 64),
        "layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8),
    }
    path = save_training_checkpoint(tmp_path / "c.pt", drafter, state_dict=state)
    loaded = load_drafter(path, LOADER_TARGET)
    assert loaded.ignored_parameters == ["layers.0.self_attn.rotary_emb.inv_freq", "lm_head.weight"]
    assert loaded.warnings == [] and same_weights(loaded.model, drafter)


# --- mismatches, one kind at a time ---------------------------------------------------------


def mismatch_message(tmp_path, drafter, state) -> str:
    return load_error(save_training_checkpoint(tmp_path / "c.pt", drafter, state_dict=state))


def test_only_missing_parameters(tmp_path, drafter):
    state = dict(drafter.state_dict())
    del state["norm.weight"]
    message = mismatch_message(tmp_path, drafter, state)
    assert "missing (1): norm.weight" in message
    assert "unexpected" not in message and "mis-shaped" not in message


def test_only_unexpected_parameters(tmp_path, drafter):
    state = {**drafter.state_dict(), "layers.0.extra.bias": torch.zeros(3)}
    message = mismatch_message(tmp_path, drafter, state)
    assert "unexpected (1): layers.0.extra.bias" in message
    assert "missing" not in message and "mis-shaped" not in message


def test_only_misshaped_parameters(tmp_path, drafter):
    state = {**drafter.state_dict(), "norm.weight": torch.zeros(65)}
    message = mismatch_message(tmp_path, drafter, state)
    assert "mis-shaped (1): norm.weight (expected [64], found [65])" in message
    assert "missing" not in message and "unexpected" not in message


def test_a_long_list_of_names_is_cut_at_fifteen(tmp_path, drafter):
    state = {**drafter.state_dict(), **{f"extra.{i:02d}": torch.zeros(1) for i in range(17)}}
    message = mismatch_message(tmp_path, drafter, state)
    assert "unexpected (17): extra.00, " in message and "extra.14 … and 2 more" in message
    assert "extra.15" not in message


def test_exactly_fifteen_names_are_all_listed(tmp_path, drafter):
    state = {**drafter.state_dict(), **{f"extra.{i:02d}": torch.zeros(1) for i in range(15)}}
    message = mismatch_message(tmp_path, drafter, state)
    assert "extra.14" in message and "more" not in message


def test_sixteen_names_are_the_first_cut(tmp_path, drafter):
    state = {**drafter.state_dict(), **{f"extra.{i:02d}": torch.zeros(1) for i in range(16)}}
    message = mismatch_message(tmp_path, drafter, state)
    assert "unexpected (16): extra.00, " in message and "extra.14 … and 1 more" in message
    assert "extra.15" not in message


def fc_of_shape(drafter, rows: int, columns: int) -> dict:
    return {**drafter.state_dict(), "fc.weight": torch.zeros(rows, columns)}


def test_a_wider_fc_alone_is_explained_by_the_layer_hint_alone(tmp_path, drafter):
    rows, columns = drafter.state_dict()["fc.weight"].shape
    message = mismatch_message(tmp_path, drafter, fc_of_shape(drafter, rows, 2 * columns))
    assert message.startswith(f"fc.weight in {tmp_path / 'c.pt'} takes {2 * columns} input")
    assert "mis-shaped" not in message and "do not match" not in message


def test_an_fc_with_other_output_rows_is_plainly_misshaped(tmp_path, drafter):
    rows, columns = drafter.state_dict()["fc.weight"].shape
    message = mismatch_message(tmp_path, drafter, fc_of_shape(drafter, rows // 2, columns))
    assert (
        f"mis-shaped (1): fc.weight (expected [{rows}, {columns}], found [{rows // 2}, {columns}])"
        in message
    )
    assert "input features" not in message


def test_a_wider_fc_and_another_misshaped_parameter_are_named_together(tmp_path, drafter):
    rows, columns = drafter.state_dict()["fc.weight"].shape
    state = {**fc_of_shape(drafter, rows, 2 * columns), "norm.weight": torch.zeros(65)}
    message = mismatch_message(tmp_path, drafter, state)
    assert "mis-shaped (1): norm.weight (expected [64], found [65])." in message
    assert f"Also: fc.weight in {tmp_path / 'c.pt'} takes {2 * columns} input" in message


# --- flags against the checkpoint -----------------------------------------------------------


def test_mask_token_id_zero_is_a_real_id(tmp_path):
    model = random_drafter(small_config(mask_token_id=0, num_target_layers=6))
    loaded = load_drafter(save_training_checkpoint(tmp_path / "c.pt", model), LOADER_TARGET)
    assert loaded.config.mask_token_id == 0 and loaded.warnings == []
    overridden = load_drafter(tmp_path / "c.pt", LOADER_TARGET, mask_token_id=2)
    assert any("overrides the checkpoint config's 0" in w for w in overridden.warnings)


def test_flags_equal_to_the_checkpoint_config_do_not_warn(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter)
    loaded = load_drafter(
        path, LOADER_TARGET, block_size=6, mask_token_id=3, target_layer_ids=[1, 3]
    )
    assert loaded.warnings == [] and loaded.config == drafter.config


def test_a_target_layer_ids_override_warns_and_is_used(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter)
    loaded = load_drafter(path, LOADER_TARGET, target_layer_ids=[2, 4])
    assert loaded.config.target_layer_ids == (2, 4)
    assert loaded.warnings == [
        "--target-layer-ids [2, 4] overrides the checkpoint config's [1, 3]; "
        "the drafter was trained with the latter"
    ]


def test_a_drafter_config_file_that_agrees_with_the_checkpoint_is_accepted(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter)
    loaded = load_drafter(path, LOADER_TARGET, config_file=config_file(tmp_path, drafter))
    assert loaded.config_source == "checkpoint" and loaded.warnings == []
    # Fields the file leaves empty are not disagreements.
    sparse = config_file(tmp_path, drafter, block_size=None, dflash_config={})
    assert load_drafter(path, LOADER_TARGET, config_file=sparse).config == drafter.config


def test_a_drafter_config_file_that_disagrees_with_the_checkpoint_is_refused(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter)
    message = load_error(path, config_file=config_file(tmp_path, drafter, intermediate_size=80))
    assert "describe different drafters (intermediate_size: checkpoint config 96 vs" in message
    assert "checkpoint config is authoritative" in message


def test_an_unreadable_drafter_config_file_is_named(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert f"Cannot read drafter config {broken}" in load_error(path, config_file=broken)
    missing = tmp_path / "missing.json"
    assert f"Cannot read drafter config {missing}" in load_error(path, config_file=missing)
