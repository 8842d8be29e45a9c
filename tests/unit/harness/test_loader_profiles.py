"""What a drafter profile changes in loading: its parameter_prefix and parameter_renames
(and their refusals), its safe_globals joined to the command line's, and the dtype a loaded
drafter offers to the next one evaluated beside it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from dflash_eval.drafter.loaders import load_drafter
from dflash_eval.drafter.pickle_policy import PicklePolicy
from dflash_eval.drafter.profile import DrafterProfile, read_profile
from dflash_eval.drafter.provenance import Offer
from dflash_eval.run.record import drafter_block

from .helpers import (
    LOADER_TARGET,
    load_error,
    same_weights,
    save_training_checkpoint,
)


def profile_of(tmp_path: Path, **content) -> DrafterProfile:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(content))
    return read_profile(path)


# --- parameter_prefix -----------------------------------------------------------------------


def test_a_profile_prefix_on_only_some_names_is_refused_naming_five_others(tmp_path, drafter):
    names = sorted(drafter.state_dict())
    state = {
        (f"draft.{n}" if n.startswith("layers.0.") else n): t
        for n, t in drafter.state_dict().items()
    }
    carrying = sum(n.startswith("layers.0.") for n in names)
    others = [n for n in names if not n.startswith("layers.0.")]
    assert carrying > 1 and len(others) > 6  # enough of each for the counts to tell
    path = save_training_checkpoint(tmp_path / "c.pt", drafter, prefix="", state_dict=state)
    message = load_error(path, profile=profile_of(tmp_path, parameter_prefix="draft."))
    assert (
        f"parameter_prefix 'draft.' is on only {carrying} of the {len(names)} parameter names "
        f"in {path} (not on e.g. {others[:5]})"
    ) in message


def test_a_profile_prefix_that_no_name_carries_changes_nothing(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter, prefix="module.")
    loaded = load_drafter(
        path, LOADER_TARGET, profile=profile_of(tmp_path, parameter_prefix="draft.")
    )
    assert loaded.source.stripped_prefix == "module." and loaded.source.renamed_parameters == 0
    assert loaded.warnings == [] and same_weights(loaded.model, drafter)


def test_the_profile_prefix_goes_first_then_the_usual_wrappers(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter, prefix="trainer.module.")
    loaded = load_drafter(
        path, LOADER_TARGET, profile=profile_of(tmp_path, parameter_prefix="trainer.")
    )
    assert loaded.source.stripped_prefix == "trainer.module."
    assert loaded.warnings == [] and same_weights(loaded.model, drafter)


# --- parameter_renames ----------------------------------------------------------------------


def test_renames_that_map_two_parameters_to_one_name_are_refused(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter)
    profile = profile_of(tmp_path, parameter_renames=[[r"\.q_proj\.", ".k_proj."]])
    message = load_error(path, profile=profile)
    assert (
        f"parameter_renames map two parameters of {path} to 'layers.0.self_attn.k_proj.weight'"
        in message
    )


def test_renames_apply_in_order_and_only_changed_names_are_counted(tmp_path, drafter):
    state = {n.replace("mlp.", "ffn."): t for n, t in drafter.state_dict().items()}
    path = save_training_checkpoint(tmp_path / "c.pt", drafter, state_dict=state)
    # The second rename only matches what the first produced: order matters.
    renames = [[r"\.ffn\.", ".feed_forward."], [r"\.feed_forward\.", ".mlp."]]
    loaded = load_drafter(
        path, LOADER_TARGET, profile=profile_of(tmp_path, parameter_renames=renames)
    )
    assert loaded.source.renamed_parameters == 3 * 2  # gate/up/down, two layers
    assert loaded.warnings == [] and same_weights(loaded.model, drafter)


# --- safe_globals ---------------------------------------------------------------------------


def test_profile_safe_globals_join_the_command_lines(tmp_path, drafter):
    """The command line admits numpy, the profile argparse: a file needing both loads, and
    the record names both; either alone is refused."""
    extra = {
        "args": argparse.Namespace(block_size=6, mask_token_id=3),
        "rng": np.arange(4, dtype=np.int64),
    }
    path = save_training_checkpoint(tmp_path / "c.pt", drafter, extra=extra)
    profile = profile_of(tmp_path, safe_globals=["argparse"])
    numpy_only = PicklePolicy(safe_globals=("numpy",))
    loaded = load_drafter(path, LOADER_TARGET, profile=profile, pickle_policy=numpy_only)
    assert same_weights(loaded.model, drafter) and loaded.warnings == []
    admitted = loaded.source.pickle.safe_globals
    assert "argparse.Namespace" in admitted and "numpy.ndarray" in admitted
    assert "Refusing to load" in load_error(path, pickle_policy=numpy_only)
    assert "Refusing to load" in load_error(path, profile=profile)


def test_profile_safe_globals_keep_the_command_lines_unsafe_choice(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter, extra={"rng": np.arange(2)})
    profile = profile_of(tmp_path, safe_globals=["argparse"])
    unsafe = PicklePolicy(allow_unsafe=True)
    loaded = load_drafter(path, LOADER_TARGET, profile=profile, pickle_policy=unsafe)
    assert loaded.source.pickle.policy == "unsafe allowed (--allow-unsafe-pickle)"
    assert loaded.source.pickle.safe_globals == ["argparse.Namespace"]


# --- the dtype offered to a drafter evaluated alike -----------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "offer"),
    [
        ({}, Offer("default rule", "float32", "default rule (as the drafter)")),
        ({"dtype": "bfloat16"}, Offer("command line", "bfloat16", "--dtype (as the drafter)")),
    ],
    ids=["default", "command-line"],
)
def test_a_loaded_drafter_offers_its_dtype_with_its_source(tmp_path, drafter, kwargs, offer):
    loaded = load_drafter(
        save_training_checkpoint(tmp_path / "c.pt", drafter), LOADER_TARGET, **kwargs
    )
    assert loaded.dtype_offer() == offer
    # The offer, passed on, reaches the next drafter with its source kept.
    other = load_drafter(
        save_training_checkpoint(tmp_path / "d.pt", drafter),
        LOADER_TARGET,
        dtype=loaded.dtype_offer(),
    )
    assert other.dtype == offer.value and other.provenance()["dtype"] == offer.source


# --- accept_keys ----------------------------------------------------------------------------


def test_an_unknown_config_key_stops_loading_unless_the_profile_accepts_it(tmp_path, drafter):
    config = {**drafter.config.to_hf_dict(), "draft_vocab_size": 32000}
    path = save_training_checkpoint(tmp_path / "c.pt", drafter, extra={"config": config})
    assert "does not know: draft_vocab_size." in load_error(path)
    profile = profile_of(tmp_path, accept_keys=["draft_vocab_size"])
    loaded = load_drafter(path, LOADER_TARGET, profile=profile)
    assert same_weights(loaded.model, drafter)
    block = drafter_block(loaded)
    assert block["accepted_config_keys"] == {"draft_vocab_size": 32000}
    assert block["profile"]["content"]["accept_keys"] == ["draft_vocab_size"]
