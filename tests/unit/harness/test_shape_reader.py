"""The dry run reads checkpoints without torch (drafter/shape_reader.py): on every kind of
checkpoint the harness reads, it finds what `torch.load` finds (the same names, shapes,
dtypes, configs, steps and pickle records), refuses what it refuses, and computes the same
parameter list from a config as the model's own modules hold."""

from __future__ import annotations

import argparse
import json
import math
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.tensor_headers import TensorInfo
from dflash_eval.drafter.checkpoint import read_drafter
from dflash_eval.drafter.dflash2_config import DFlash2Parts
from dflash_eval.drafter.fit import parameter_shapes
from dflash_eval.drafter.model_dflash2 import drafter_class
from dflash_eval.drafter.pickle_policy import PicklePolicy
from dflash_eval.drafter.shape_reader import SHAPES_READER
from dflash_eval.drafter.torch_reader import TORCH_READER
from safetensors.torch import save_file

from .helpers import loader_drafter, save_training_checkpoint, small_config

SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "I64": "int64"}


def same(loaded: Any, read: Any) -> bool:
    """`read` (the shape reader's) holds what `loaded` (torch's) holds, tensors as shapes."""
    if isinstance(loaded, torch.Tensor):
        dtype = SAFETENSORS_DTYPES.get(read.dtype, read.dtype)
        return (
            isinstance(read, TensorInfo)
            and read.shape == tuple(loaded.shape)
            and f"torch.{dtype}" == str(loaded.dtype)
            and read.numel() == loaded.numel()
            and read.ndim == loaded.ndim
        )
    if isinstance(loaded, dict):
        return (
            type(read) is type(loaded)
            and list(read) == list(loaded)
            and all(same(value, read[key]) for key, value in loaded.items())
            and (not hasattr(loaded, "__dict__") or same(vars(loaded), vars(read)))
        )
    if isinstance(loaded, list | tuple) and not isinstance(loaded, torch.Size):
        return (
            type(read) is type(loaded)
            and len(read) == len(loaded)
            and all(same(a, b) for a, b in zip(loaded, read, strict=True))
        )
    if isinstance(loaded, torch.dtype | torch.device):
        return str(loaded) == read
    return bool(loaded == read)


WEIGHTS_ONLY = PicklePolicy()


def both(path: Path, policy: PicklePolicy = WEIGHTS_ONLY) -> tuple[Any, Any]:
    (loaded, torch_record), (read, shape_record) = (
        TORCH_READER.read_pickle(path, policy),
        SHAPES_READER.read_pickle(path, policy),
    )
    assert shape_record == torch_record
    return loaded, read


def test_the_lab_checkpoints_read_alike(lab):
    for path in lab.checkpoints.values():
        assert same(*both(path))


def unusual_tensors() -> dict[str, Any]:
    """Views into shared storages, a parameter, scalars, empty and integer tensors, and the
    values torch pickles as globals (dtypes, devices, sizes)."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "rows": base[1:3],
        "strided": base[:, ::2],
        "transposed": base.t(),
        "scalar": base[0, 0],
        "parameter": torch.nn.Parameter(torch.ones(3, 2)),
        "empty": torch.empty(0, 5),
        "ids": torch.arange(7),
        "mask": torch.ones(2, 2, dtype=torch.bool),
        "half": torch.zeros(3, dtype=torch.float16),
        "brain": torch.zeros(2, 3, dtype=torch.bfloat16),
        "dtype": torch.bfloat16,
        "device": torch.device("cpu"),
        "size": torch.Size([2, 3]),
        "bytes": b"\x00\xff",
        "set": {1, 2},
        "nested": [(1, 2.5, None, True), {"a": [torch.zeros(1)]}],
    }


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_unusual_tensors_and_values_read_alike_in_both_formats(tmp_path, legacy):
    path = tmp_path / "c.pt"
    torch.save(unusual_tensors(), path, _use_new_zipfile_serialization=not legacy)
    loaded, read = both(path)
    assert same(loaded, read)
    assert read["rows"] == TensorInfo((2, 6), "float32")


def test_a_state_dict_keeps_its_ordered_dict_and_metadata(tmp_path):
    path = tmp_path / "c.pt"
    torch.save(loader_drafter().state_dict(), path)
    loaded, read = both(path)
    assert type(read) is OrderedDict and read._metadata == loaded._metadata
    assert same(loaded, read)


def drafter_sources(tmp_path: Path) -> dict[str, tuple[Path, PicklePolicy]]:
    """A checkpoint of every format and layout the loader tests read."""
    model = loader_drafter()
    state = model.state_dict()
    args = argparse.Namespace(block_size=6, mask_token_id=3, target_layer_ids=[1, 3])
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    save_file({k: t.contiguous() for k, t in state.items()}, hf_dir / "model.safetensors")
    (hf_dir / "config.json").write_text(json.dumps(model.config.to_hf_dict()))
    plain = PicklePolicy()
    return {
        "training": (save_training_checkpoint(tmp_path / "a" / "checkpoint.pt", model), plain),
        "no config, args": (
            save_training_checkpoint(
                tmp_path / "step_42" / "checkpoint.pt",
                model,
                prefix="_orig_mod.module.",
                with_config=False,
                extra={"args": args},
            ),
            PicklePolicy(("argparse",)),
        ),
        "bf16": (
            save_training_checkpoint(
                tmp_path / "b" / "checkpoint.pt",
                model,
                state_dict={k: t.bfloat16() for k, t in state.items()},
            ),
            plain,
        ),
        "unsafe args": (
            save_training_checkpoint(
                tmp_path / "c" / "checkpoint.pt", model, with_config=False, extra={"args": args}
            ),
            PicklePolicy((), allow_unsafe=True),
        ),
        "hf directory": (hf_dir, plain),
    }


def test_every_checkpoint_format_reads_as_the_run_reads_it(tmp_path):
    for name, (path, policy) in drafter_sources(tmp_path).items():
        loaded = read_drafter(path, TORCH_READER, policy)
        read = read_drafter(path, SHAPES_READER, policy)
        for field in (
            "kind",
            "files",
            "config_dict",
            "step",
            "step_source",
            "stripped_prefix",
            "dropped_entries",
            "extra_hints",
            "pickle",
            "renamed_parameters",
        ):
            assert getattr(read, field) == getattr(loaded, field), (name, field)
        assert same(loaded.state_dict, read.state_dict), name


def test_the_parameter_list_is_the_models_own(tmp_path):
    """For plain and DFlash-2 configs of every shape the loader meets, names and shapes equal
    the modules' (built on the meta device)."""
    configs = [
        small_config(),
        small_config(num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=8),
        small_config(head_dim=24, intermediate_size=40, target_layer_ids=(0, 2, 4, 5)),
        small_config(
            num_hidden_layers=3,
            layer_types=("sliding_attention", "full_attention", "sliding_attention"),
            sliding_window=8,
            rope_type="yarn",
            rope_scaling={"factor": 4.0, "original_max_position_embeddings": 512},
            partial_rotary_factor=0.5,
        ),
        small_config(vocab_size=101, dflash2=DFlash2Parts(3, 16, 8, 4)),
        small_config(num_hidden_layers=3, vocab_size=50, dflash2=DFlash2Parts(5, 8, 4, 2)),
    ]
    for config in configs:
        with torch.device("meta"):
            model = drafter_class(config)(config)
        assert parameter_shapes(config) == {
            name: tuple(p.shape) for name, p in model.named_parameters()
        }


def rewritten(source: Path, target: Path, edit) -> Path:
    """A copy of a zip checkpoint with each record passed through edit(name, bytes)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            new.writestr(info, edit(info.filename, old.read(info.filename)))
    return target


def damaged(tmp_path: Path) -> dict[str, Path]:
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(100)}, good)
    size = good.stat().st_size
    text, zeros, empty = tmp_path / "text.pt", tmp_path / "zeros.pt", tmp_path / "empty.pt"
    text.write_text("model_state_dict = not a pickle\n")
    zeros.write_bytes(bytes(4096))
    empty.write_bytes(b"")
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[: size // 2])
    return {"text": text, "zeros": zeros, "empty": empty, "cut": cut}


def test_damaged_files_are_unreadable_to_both(tmp_path):
    for name, path in damaged(tmp_path).items():
        for reader in (TORCH_READER, SHAPES_READER):
            with pytest.raises(HarnessError, match=rf"^Cannot read {path} \(") as caught:
                reader.read_pickle(path, PicklePolicy())
            assert "re-stage it" in str(caught.value), name


def test_a_storage_record_shorter_than_its_tensor_is_unreadable_to_both(tmp_path):
    """torch.load with mmap (the run's) does not check a record's size: it returned this
    tensor with whatever followed the record after element 25. Both readers check first."""
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(100)}, good)
    short = rewritten(good, tmp_path / "short.pt", lambda n, b: b[:100] if n.endswith("/0") else b)
    assert torch.load(short, weights_only=True, mmap=True)["w"].shape == (100,)  # no error
    for reader in (TORCH_READER, SHAPES_READER):
        with pytest.raises(HarnessError, match=r"storage 0 holds 100 bytes of 400"):
            reader.read_pickle(short, PicklePolicy())


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        # The pickle's shape (BININT1 4, TUPLE1) and strides (BININT1 1, TUPLE1), edited.
        ((b"K\x04\x85q\x08", b"K\x08\x85q\x08"), r"past its storage of 4 elements"),
        ((b"K\x01\x85q\t", b"J\xff\xff\xff\xff\x85q\t"), r"with strides \[-1\]"),
    ],
    ids=["shape", "stride"],
)
def test_a_tensor_outside_its_storage_is_unreadable_to_both(tmp_path, edit, reason):
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(4)}, good)
    bad = rewritten(
        good, tmp_path / "bad.pt", lambda n, b: b.replace(*edit) if n.endswith("data.pkl") else b
    )
    assert bad.read_bytes() != good.read_bytes()
    for reader in (TORCH_READER, SHAPES_READER):
        with pytest.raises(HarnessError, match=reason):
            reader.read_pickle(bad, PicklePolicy())


def test_a_torch_name_the_reader_does_not_rebuild_says_so(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)}, path)
    assert TORCH_READER.read_pickle(path, PicklePolicy())[0]["q"].shape == (2,)
    with pytest.raises(HarnessError, match=r"without torch: it holds torch\.\w"):
        SHAPES_READER.read_pickle(path, PicklePolicy())


def test_tensor_info_counts_as_a_tensor_does():
    info = TensorInfo((3, 0, 2), "float32")
    assert (info.ndim, info.numel()) == (3, 0) == (torch.empty(3, 0, 2).ndim, 0)
    assert TensorInfo((), "int64").numel() == 1 == math.prod(())
