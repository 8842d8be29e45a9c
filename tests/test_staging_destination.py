"""Where a staged checkpoint goes and when a copy counts as already staged, on the
workstation side (real bash and files in a temporary directory; no SSH): the manifest must
match the trainer's file in every field, a damaged manifest is no manifest, and promotion
puts the verified file and its manifest in place together."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dflash_ops.core import inventory
from dflash_ops.core.errors import InventoryError, RemoteCommandError
from dflash_ops.staging.destination import (
    Destination,
    DestinationState,
    Identity,
    staged_path,
)
from dflash_ops.staging.relay import LocalSide

IDENTITY = Identity("trainer", "/ckpt/step_4000/checkpoint.pt", 1234, 1700000000, 4000)


def manifest_of(identity: Identity = IDENTITY, **changes) -> dict:
    values = {
        "source_host": identity.source_host,
        "source_path": identity.source_path,
        "size": identity.size,
        "mtime": identity.mtime,
        "step": identity.step,
        "sha256": "ab" * 32,
    }
    values.update(changes)
    return values


def an_inventory(tmp_path: Path, **local) -> inventory.Inventory:
    document = {
        "hosts": {
            "trainer": {"role": "trainer", "address": "t", "checkpoints": "/ckpt"},
            "eval": {
                "role": "eval",
                "address": "e",
                "workdir": "/srv/eval/",
                "venv": {"path": "/v"},
                "target_model": "/m",
            },
            "eval2": {
                "role": "eval",
                "address": "e2",
                "workdir": "/w2",
                "checkpoints": "/data/staged/",
                "venv": {"path": "/v"},
                "target_model": "/m",
            },
        },
        "local": local,
    }
    return inventory.parse(document, tmp_path / "inv.yaml")


@pytest.fixture
def destination(tmp_path) -> Destination:
    return Destination(LocalSide(), str(tmp_path / "step_4000" / "checkpoint.pt"))


# --- where ----------------------------------------------------------------------------------


def test_staged_paths_per_host_and_on_the_workstation(tmp_path):
    inv = an_inventory(tmp_path, staging="stage")
    assert staged_path(inv, "eval", 7) == "/srv/eval/checkpoints/step_7/checkpoint.pt"
    assert staged_path(inv, "eval2", 7) == "/data/staged/step_7/checkpoint.pt"
    assert staged_path(inv, "workstation", 7) == f"{tmp_path}/stage/step_7/checkpoint.pt"


def test_two_hop_without_local_staging_is_explained(tmp_path):
    with pytest.raises(InventoryError, match=r"two-hop mode needs local\.staging set"):
        staged_path(an_inventory(tmp_path), "workstation", 7)
    with pytest.raises(InventoryError, match="no eval host named 'nope'"):
        staged_path(an_inventory(tmp_path), "nope", 7)


def test_the_partial_manifest_and_lock_sit_beside_the_file(destination, tmp_path):
    directory = tmp_path / "step_4000"
    assert destination.partial == f"{directory}/checkpoint.pt.partial"
    assert destination.manifest == f"{directory}/checkpoint.pt.manifest.json"
    assert destination.lock == f"{directory}/.checkpoint.pt.lock"
    assert destination.directory == str(directory)
    assert str(destination) == f"workstation:{directory}/checkpoint.pt"
    at_root = Destination(LocalSide(), "/checkpoint.pt")
    assert at_root.directory == "/"


# --- when a copy is already staged ----------------------------------------------------------


def test_a_copy_matches_only_when_every_recorded_field_agrees():
    state = DestinationState(manifest_of(), 1234, None, 0)
    assert state.matches(IDENTITY)
    for change in (
        {"size": 1235},
        {"mtime": 1700000001},
        {"source_path": "/ckpt/other.pt"},
        {"source_host": "trainer2"},
        {"sha256": None},
    ):
        assert not DestinationState(manifest_of(**change), 1234, None, 0).matches(IDENTITY)
    assert not DestinationState(manifest_of(), 1233, None, 0).matches(IDENTITY)
    assert not DestinationState(manifest_of(), None, None, 0).matches(IDENTITY)
    assert not DestinationState(None, 1234, None, 0).matches(IDENTITY)


def test_state_of_an_empty_destination(destination):
    state = destination.state()
    assert (state.manifest, state.final_size, state.partial_size) == (None, None, None)
    assert state.free > 0
    assert destination.side.hasher == "python3"  # learnt in the same round trip


def test_state_reads_the_manifest_and_both_sizes(destination):
    directory = Path(destination.directory)
    directory.mkdir()
    Path(destination.path).write_bytes(b"x" * 1234)
    Path(destination.partial).write_bytes(b"y" * 99)
    Path(destination.manifest).write_text(json.dumps(manifest_of()))
    state = destination.state()
    assert state.manifest == manifest_of()
    assert (state.final_size, state.partial_size) == (1234, 99)
    assert state.matches(IDENTITY)
    stats = os.statvfs(directory)
    assert abs(state.free - stats.f_bavail * stats.f_frsize) < 256 << 20


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", '"a string"'])
def test_a_damaged_manifest_counts_as_none(destination, text):
    Path(destination.directory).mkdir()
    Path(destination.path).write_bytes(b"x" * 1234)
    Path(destination.manifest).write_text(text)
    state = destination.state()
    assert state.manifest is None and state.final_size == 1234
    assert not state.matches(IDENTITY)


# --- promotion ------------------------------------------------------------------------------


def test_promote_puts_the_partial_in_place_with_its_manifest(destination):
    Path(destination.directory).mkdir()
    Path(destination.partial).write_bytes(b"verified bytes")
    destination.promote(manifest_of(size=14, note='it\'s "quoted"'))
    assert Path(destination.path).read_bytes() == b"verified bytes"
    assert not Path(destination.partial).exists()
    assert json.loads(Path(destination.manifest).read_text()) == manifest_of(
        size=14, note='it\'s "quoted"'
    )
    assert not Path(f"{destination.manifest}.tmp").exists()


def test_promote_without_a_partial_fails_and_writes_no_manifest(destination):
    Path(destination.directory).mkdir()
    with pytest.raises(RemoteCommandError, match="exited 1"):
        destination.promote(manifest_of())
    assert not Path(destination.manifest).exists()


def test_remove_partial_removes_only_the_partial(destination):
    Path(destination.directory).mkdir()
    Path(destination.partial).write_bytes(b"half")
    Path(destination.path).write_bytes(b"whole")
    destination.remove_partial()
    destination.remove_partial()  # nothing there: still fine
    assert not Path(destination.partial).exists()
    assert Path(destination.path).read_bytes() == b"whole"
