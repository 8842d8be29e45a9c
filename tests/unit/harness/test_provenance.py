"""Provenance of every drafter setting: where each came from, and no silent guesses.

The reproduced bugs (issue 11): a training checkpoint without config, given what the old
error asked for (--block-size, --mask-token-id), silently got target_layer_ids from the
default rule though it was trained on other layers; passing the right --target-layer-ids
drew a false "overrides the checkpoint config's" warning; a mask id from the training args
was labelled "from --mask-token-id".
"""

from __future__ import annotations

import json

import pytest
import torch
from dflash_eval.cli import main
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.summary import summary_lines
from dflash_eval.drafter.loaders import load_drafter
from dflash_eval.drafter.profile import read_profile
from dflash_eval.target.config import TargetShape

from .helpers import (
    quick_eval,
    random_drafter,
    same_weights,
    save_training_checkpoint,
    small_config,
)

# A 6-layer target: the default rule for K=2 gives [1, 3]; this drafter was trained on [1, 4].
TARGET = TargetShape(
    num_layers=6, hidden_size=64, vocab_size=200, rms_norm_eps=1e-6, rope_theta=10_000.0
)
TRAINED = {"target_layer_ids": (1, 4), "block_size": 8, "mask_token_id": 127}


@pytest.fixture
def drafter():
    return random_drafter(small_config(num_target_layers=6, **TRAINED))


@pytest.fixture
def configless(tmp_path, drafter):
    return save_training_checkpoint(
        tmp_path / "step_100" / "checkpoint.pt", drafter, with_config=False
    )


def _profile(tmp_path, **content) -> object:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(content))
    return read_profile(path)


def test_guessed_target_layers_stop_the_run_and_say_how_to_give_them(configless):
    with pytest.raises(HarnessError) as caught:
        load_drafter(configless, TARGET, block_size=8, mask_token_id=127, accept_default=["rope"])
    message = str(caught.value)
    assert "target_layer_ids" in message and "[1, 3]" in message
    assert "--target-layer-ids" in message and "--accept-default target_layer_ids" in message


def test_unstated_rope_also_needs_to_be_given_or_confirmed(configless):
    with pytest.raises(HarnessError, match="--accept-default rope"):
        load_drafter(configless, TARGET, block_size=8, mask_token_id=127, target_layer_ids=[1, 4])


def test_the_right_layer_ids_on_the_command_line_load_without_a_warning(configless, drafter):
    loaded = load_drafter(
        configless,
        TARGET,
        block_size=8,
        mask_token_id=127,
        target_layer_ids=[1, 4],
        accept_default=["rope"],
    )
    assert loaded.warnings == []
    assert loaded.config.target_layer_ids == (1, 4)
    assert loaded.provenance() == {
        "block_size": "command line",
        "mask_token_id": "command line",
        "num_target_layers": "default rule",
        "target_layer_ids": "command line",
        "rope": "default rule",
        "dtype": "default rule",
    }
    assert loaded.accepted_defaults() == {"rope": "command line"}
    assert same_weights(loaded.model, drafter)


def test_settings_from_training_args_are_labelled_as_such(tmp_path, drafter):
    path = save_training_checkpoint(
        tmp_path / "c.pt",
        drafter,
        with_config=False,
        extra={"args": {"block_size": 8, "mask_token_id": 127, "target_layer_ids": [1, 4]}},
    )
    loaded = load_drafter(path, TARGET, accept_default=["rope"])
    provenance = loaded.provenance()
    assert provenance["mask_token_id"] == provenance["block_size"] == "training args"
    assert provenance["target_layer_ids"] == "training args"
    assert "mask_token_id 127 from the training args" in loaded.notes
    assert not any("--mask-token-id" in note for note in loaded.notes)
    assert loaded.warnings == [] and loaded.trained_block_size == 8


def test_confirmed_default_rules_are_used_and_recorded(configless):
    loaded = load_drafter(
        configless,
        TARGET,
        block_size=8,
        mask_token_id=127,
        accept_default=["target_layer_ids", "rope"],
    )
    assert loaded.config.target_layer_ids == (1, 3)  # the rule's guess, as confirmed
    assert loaded.provenance()["target_layer_ids"] == "default rule"
    assert loaded.accepted_defaults() == {
        "target_layer_ids": "command line",
        "rope": "command line",
    }
    assert loaded.config.rope_theta == TARGET.rope_theta


def test_a_checkpoint_config_states_everything(tmp_path, drafter):
    loaded = load_drafter(save_training_checkpoint(tmp_path / "c.pt", drafter), TARGET)
    assert loaded.warnings == []
    assert set(loaded.provenance().values()) == {"checkpoint config", "default rule"}
    assert loaded.provenance()["dtype"] == "default rule"  # an evaluation choice, not guessed


def test_flags_equal_to_the_config_do_not_warn_and_differing_ones_name_the_source(
    tmp_path, drafter
):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter)
    same = load_drafter(path, TARGET, target_layer_ids=[1, 4], mask_token_id=127, block_size=8)
    assert same.warnings == [] and same.provenance()["target_layer_ids"] == "command line"
    other = load_drafter(path, TARGET, target_layer_ids=[2, 4])
    assert other.warnings == [
        "--target-layer-ids [2, 4] overrides the checkpoint config's [1, 4]; the drafter was "
        "trained with the latter"
    ]


def test_a_profile_supplies_settings_names_and_confirmations(tmp_path, drafter):
    state = {
        f"draft.{name.replace('self_attn', 'attention')}": t
        for name, t in drafter.state_dict().items()
    }
    path = save_training_checkpoint(
        tmp_path / "c.pt", drafter, with_config=False, prefix="module.", state_dict=state
    )
    profile = _profile(
        tmp_path,
        name="lab-trainer",
        block_size=8,
        mask_token_id=127,
        target_layer_ids=[1, 4],
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        dtype="bfloat16",
        parameter_prefix="module.draft.",
        parameter_renames=[[r"\.attention\.", ".self_attn."]],
        accept_default=["num_target_layers"],
    )
    loaded = load_drafter(path, TARGET, profile=profile)
    assert loaded.warnings == []
    assert loaded.provenance() == {
        "block_size": "profile",
        "mask_token_id": "profile",
        "num_target_layers": "default rule",
        "target_layer_ids": "profile",
        "rope": "profile",
        "dtype": "profile",
    }
    assert loaded.dtype == "bfloat16" and next(loaded.model.parameters()).dtype == torch.bfloat16
    assert loaded.source.stripped_prefix == "module.draft."
    assert loaded.source.renamed_parameters == 2 * 6  # q/k/v/o proj + q/k norm, two layers


def test_sources_that_disagree_stop_the_run_naming_them(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter, extra={"args": {"block_size": 16}})
    with pytest.raises(HarnessError) as caught:
        load_drafter(path, TARGET)
    message = str(caught.value)
    assert "disagree on block_size" in message
    assert "checkpoint config: 8" in message and "training args: 16" in message
    profile = _profile(tmp_path, mask_token_id=5)
    with pytest.raises(HarnessError, match=r"checkpoint config: 127; profile .*: 5"):
        load_drafter(save_training_checkpoint(tmp_path / "d.pt", drafter), TARGET, profile=profile)


def test_bad_profiles_and_confirmations_are_refused(tmp_path, configless):
    with pytest.raises(HarnessError, match="unknown keys \\['target_layers'\\]"):
        _profile(tmp_path, target_layers=[1, 4])
    with pytest.raises(HarnessError, match="'block_size' must be a int"):
        _profile(tmp_path, block_size="8")
    with pytest.raises(HarnessError, match="only settings with a default rule"):
        load_drafter(configless, TARGET, accept_default=["block_size"])


def _configless_lab_copy(lab, tmp_path):
    checkpoint = torch.load(lab.checkpoints[6000], weights_only=True)
    config = checkpoint.pop("config")
    checkpoint.pop("args")
    path = tmp_path / "configless" / "step_6000" / "checkpoint.pt"
    path.parent.mkdir(parents=True)
    torch.save(checkpoint, path)
    return path, config


def test_results_record_provenance_and_clean_loads_have_no_warnings(lab, tmp_path):
    reference = quick_eval(lab, tmp_path)
    assert reference["warnings"] == []
    assert reference["drafter"]["provenance"]["target_layer_ids"] == "checkpoint config"
    path, config = _configless_lab_copy(lab, tmp_path)
    profile = tmp_path / "profile.json"
    dflash = config["dflash_config"]
    profile.write_text(
        json.dumps(
            {
                "name": "lab",
                "block_size": config["block_size"],
                "mask_token_id": dflash["mask_token_id"],
                "target_layer_ids": dflash["target_layer_ids"],
                "num_target_layers": config["num_target_layers"],
                "rope_parameters": {"rope_type": "default", "rope_theta": config["rope_theta"]},
            }
        )
    )
    results = quick_eval(lab, tmp_path, checkpoint=path, drafter_profile=profile)
    drafter = results["drafter"]
    assert results["warnings"] == []
    assert drafter["provenance"] == {
        "block_size": "profile",
        "mask_token_id": "profile",
        "num_target_layers": "profile",
        "target_layer_ids": "profile",
        "rope": "profile",
        "dtype": "default rule",
    }
    assert drafter["settings"]["target_layer_ids"] == dflash["target_layer_ids"]
    assert drafter["profile"]["name"] == "lab" and drafter["accepted_defaults"] == {}
    assert drafter["config_source"].startswith("inferred")
    # The same drafter, described by the profile instead of its config: the same numbers.
    assert results["metrics"] == reference["metrics"]
    summary = "\n".join(summary_lines(results))
    assert (
        "target_layer_ids [1, 3] (profile)" in summary and "dtype float32 (default rule)" in summary
    )


def test_command_line_flags_reach_the_loader_and_the_summary(lab, tmp_path, capsys):
    path, config = _configless_lab_copy(lab, tmp_path)
    argv = [
        "eval",
        *("--checkpoint", str(path), "--target", str(lab.target_dir)),
        *("--out", str(tmp_path / "r.json"), "--prompts", str(lab.prompts)),
        *("--num-prompts", "1", "--max-new-tokens", "16", "--ddtree", ""),
        *("--cache-dir", str(tmp_path / "cache"), "--threads", "1"),
        *("--block-size", str(config["block_size"])),
        *("--mask-token-id", str(config["dflash_config"]["mask_token_id"])),
    ]
    assert main(argv) == 2
    assert "--accept-default target_layer_ids" in capsys.readouterr().err
    assert main([*argv, "--accept-default", "target_layer_ids,rope"]) == 0
    err = capsys.readouterr().err
    assert "target_layer_ids [1, 3] (default rule, accepted by command line)" in err
    assert "block_size 8 (command line)" in err
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["options"]["accept_default"] == ["target_layer_ids", "rope"]
    assert results["drafter"]["accepted_defaults"] == {
        "target_layer_ids": "command line",
        "rope": "command line",
    }


def test_the_reference_drafter_runs_in_the_drafters_dtype(lab, tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"name": "bf16", "dtype": "bfloat16"}))
    results = quick_eval(
        lab,
        tmp_path,
        num_prompts=1,
        max_new_tokens=16,
        drafter_profile=profile,
        reference_drafter=lab.checkpoints[2000],
    )
    for block in (results["drafter"], results["reference"]["drafter"]):
        assert block["dtype"] == "bfloat16" and block["provenance"]["dtype"] == "profile"
    assert results["reference"]["drafter"]["profile"] is None
    assert results["warnings"] == []
