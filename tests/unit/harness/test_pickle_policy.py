"""The pickle policy: weights only, plus globals the user names; all else only when unsafe.

Checkpoints are written in both torch formats (zip, and the legacy one with
`_use_new_zipfile_serialization=False`), because torch reads them with different code.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest
import torch
from dflash_eval.cli import main
from dflash_eval.contract.errors import HarnessError
from dflash_eval.drafter.loaders import load_drafter
from dflash_eval.drafter.pickle_policy import FULL_UNPICKLE, WITH_SAFE_GLOBALS, PicklePolicy
from dflash_eval.target.config import TargetShape

from .helpers import quick_eval, random_drafter, save_training_checkpoint, small_config

TARGET = TargetShape(
    num_layers=6, hidden_size=64, vocab_size=101, rms_norm_eps=1e-6, rope_theta=10_000.0
)
FORMATS = {"zip": True, "legacy": False}


class RunsCommand:
    """Unpickling this runs a shell command: what a malicious checkpoint does."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class RunsSubprocess(RunsCommand):
    """The same through a module torch's own blocklist does not name."""

    def __reduce__(self):
        return (subprocess.call, (["touch", str(self.marker)],))


class TouchesFile(RunsCommand):
    """The same through a harmless-looking method of a harmless-looking class."""

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def _save(path, model, zip_format: bool, extra: dict) -> pathlib.Path:
    state = {f"module.{name}": t.clone() for name, t in model.state_dict().items()}
    checkpoint = {"model_state_dict": state, "step": 10, **extra}
    torch.save(checkpoint, path, _use_new_zipfile_serialization=zip_format)
    return path


def _training_extras() -> dict:
    """What training scripts commonly store beside the weights."""
    np.random.seed(0)
    return {
        "args": argparse.Namespace(block_size=6, mask_token_id=3, lr=3e-4, run_name="lab"),
        "rng_state": {"numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        "best_loss": np.float64(1.25),
        "config": small_config(num_target_layers=6).to_hf_dict(),
    }


@pytest.fixture
def drafter():
    return random_drafter(small_config(num_target_layers=6))


@pytest.mark.parametrize("fmt", FORMATS)
def test_namespace_and_numpy_rng_state_are_refused_with_advice(tmp_path, drafter, fmt):
    path = _save(tmp_path / "c.pt", drafter, FORMATS[fmt], _training_extras())
    with pytest.raises(HarnessError) as caught:
        load_drafter(path, TARGET)
    message = str(caught.value)
    assert "Refusing to load" in message and "--allow-unsafe-pickle" in message
    assert "Unsupported global" in message  # what the file wanted, in torch's words
    if fmt == "zip":  # the zip format can be inspected without unpickling
        assert "--safe-globals argparse,numpy" in message


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "names",
    [("argparse", "numpy"), ("argparse.Namespace", "numpy")],
    ids=["groups", "dotted-and-group"],
)
def test_named_safe_globals_load_them_and_are_recorded(tmp_path, drafter, fmt, names):
    extras = {**_training_extras(), "config": None}  # the mask/block come from the args
    path = _save(tmp_path / "c.pt", drafter, FORMATS[fmt], extras)
    loaded = load_drafter(
        path, TARGET, target_layer_ids=[1, 3], accept_default=["rope"], pickle_policy=_policy(names)
    )
    assert loaded.provenance()["block_size"] == "training args"
    assert loaded.provenance()["mask_token_id"] == "training args"
    assert loaded.config.block_size == 6 and loaded.config.mask_token_id == 3
    record = loaded.source.pickle.to_dict()
    assert record["policy"] == WITH_SAFE_GLOBALS and record["loaded_with"] == WITH_SAFE_GLOBALS
    assert "argparse.Namespace" in record["safe_globals"]
    if fmt == "zip":
        assert "argparse.Namespace" in record["file_globals"]
    else:
        assert record["file_globals"] is None


def _policy(names, unsafe: bool = False) -> PicklePolicy:
    return PicklePolicy(tuple(names), unsafe)


PAYLOADS = {"os.system": RunsCommand, "subprocess.call": RunsSubprocess, "Path.touch": TouchesFile}
SAFE_MODES = {
    "weights-only": (),
    "built-in groups": ("argparse", "numpy", "pathlib", "datetime"),
    "dotted names": ("argparse.Namespace", "numpy.ndarray", "numpy.dtype"),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("mode", SAFE_MODES)
def test_malicious_pickle_is_refused_in_every_mode_but_unsafe(
    tmp_path, drafter, fmt, payload, mode
):
    marker = tmp_path / "pwned"
    extras = {**_training_extras(), "payload": PAYLOADS[payload](marker)}
    path = _save(tmp_path / "c.pt", drafter, FORMATS[fmt], extras)
    with pytest.raises(HarnessError, match="Refusing to load") as caught:
        load_drafter(path, TARGET, pickle_policy=_policy(SAFE_MODES[mode]))
    assert not marker.exists()
    if fmt == "zip":  # named, and never suggested
        assert "no --safe-globals admits it" in str(caught.value)


@pytest.mark.parametrize(
    "name",
    ["os.system", "posix.system", "subprocess.call", "commands.call", "builtins.eval", "timeit"],
)
def test_naming_a_command_running_global_is_refused(tmp_path, drafter, name):
    marker = tmp_path / "pwned"
    extras = {"payload": RunsCommand(marker), "config": drafter.config.to_hf_dict()}
    path = _save(tmp_path / "c.pt", drafter, True, extras)
    with pytest.raises(HarnessError, match="not on the harness's list of inert globals"):
        load_drafter(path, TARGET, pickle_policy=_policy([name]))
    assert not marker.exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_unsafe_flag_unpickles_everything_and_says_so(tmp_path, drafter, fmt):
    marker = tmp_path / "pwned"
    extras = {**_training_extras(), "payload": RunsCommand(marker)}
    path = _save(tmp_path / "c.pt", drafter, FORMATS[fmt], extras)
    loaded = load_drafter(path, TARGET, pickle_policy=_policy((), unsafe=True))
    assert marker.exists()  # the test can see a payload run: the refusals above are real
    assert loaded.source.pickle.loaded_with == FULL_UNPICKLE
    assert loaded.source.pickle.policy.startswith("unsafe allowed")


def test_a_plain_checkpoint_under_the_unsafe_flag_is_still_read_weights_only(tmp_path, drafter):
    path = save_training_checkpoint(tmp_path / "c.pt", drafter)
    loaded = load_drafter(path, TARGET, pickle_policy=_policy((), unsafe=True))
    assert loaded.source.pickle.loaded_with == "weights-only"


def test_extract_takes_the_policy_and_records_it(tmp_path, drafter, capsys):
    (tmp_path / "step_10").mkdir()
    path = _save(tmp_path / "step_10" / "c.pt", drafter, True, _training_extras())
    out = tmp_path / "extracted"
    assert main(["extract", "--checkpoint", str(path), "--out", str(out)]) == 2
    assert "--safe-globals argparse,numpy" in capsys.readouterr().err
    argv = [
        "extract",
        "--checkpoint",
        str(path),
        "--out",
        str(out),
        "--safe-globals",
        "argparse,numpy",
    ]
    assert main(argv) == 0
    record = json.loads((out / "dflash_extract.json").read_text())
    assert record["pickle"]["loaded_with"] == WITH_SAFE_GLOBALS
    assert record["hints"]["block_size"] == 6


def test_results_record_the_pickle_policy(lab, tmp_path):
    checkpoint = torch.load(lab.checkpoints[6000], weights_only=True)
    checkpoint["args"] = argparse.Namespace(**checkpoint["args"])
    path = tmp_path / "step_6000" / "checkpoint.pt"
    path.parent.mkdir()
    torch.save(checkpoint, path)
    with pytest.raises(HarnessError, match="--safe-globals argparse"):
        quick_eval(lab, tmp_path, checkpoint=path, num_prompts=1)
    results = quick_eval(lab, tmp_path, checkpoint=path, num_prompts=1, safe_globals=["argparse"])
    assert results["checkpoint"]["pickle"] == {
        "policy": WITH_SAFE_GLOBALS,
        "safe_globals": ["argparse.Namespace"],
        "loaded_with": WITH_SAFE_GLOBALS,
        "file_globals": ["argparse.Namespace"],
    }
    assert results["options"]["safe_globals"] == ["argparse"]
    assert results["warnings"] == []
