"""What counts as "already staged", and the parsers of a destination's and a directory's state,
on captured output (no hosts)."""

from __future__ import annotations

import pytest
from dflash_eval.contract import weights

from dflash_ops.core.errors import CheckpointError
from dflash_ops.staging.catalog import parse_listing
from dflash_ops.staging.destination import Destination
from dflash_ops.staging.manifest import Identity, Member, matches, set_digest, set_manifest
from dflash_ops.staging.sides import LocalSide
from dflash_ops.staging.strip import harness_keys, weight_members

IDENTITY = Identity("trainer", "/ckpt/checkpoint-4000", 300, 1700000000, 4000)
FILES = (Member("config.json", 100, 1700000000), Member("model.safetensors", 200, 1699999999))
RECORDS = [{**m.record(), "sha256": "a" * 64} for m in FILES]


def test_a_directory_manifest_matches_only_the_same_files():
    manifest = set_manifest(IDENTITY, "directory", RECORDS, "trainer:/ckpt")
    assert matches(manifest, IDENTITY, "directory", FILES)
    rewritten = (FILES[0], Member("model.safetensors", 200, 1700000005))
    assert not matches(manifest, IDENTITY, "directory", rewritten)
    assert not matches(manifest, IDENTITY, "directory", (*FILES, Member("new", 1, 1)))
    assert not matches(manifest, IDENTITY, "file", FILES)  # another kind of copy


def test_an_extracted_copy_is_known_by_its_source_alone():
    manifest = set_manifest(IDENTITY, "extracted", RECORDS, "trainer:/ckpt", {"x": 1})
    assert matches(manifest, IDENTITY, "extracted", ())
    moved = Identity("trainer", "/ckpt/checkpoint-4000", 300, 1700000001, 4000)
    assert not matches(manifest, moved, "extracted", ())


def test_the_set_digest_does_not_depend_on_order():
    assert set_digest(RECORDS) == set_digest(list(reversed(RECORDS)))
    changed = [RECORDS[0], {**RECORDS[1], "sha256": "b" * 64}]
    assert set_digest(changed) != set_digest(RECORDS)


def test_a_verified_record_is_reused_only_for_the_same_file():
    member = Member("model.safetensors", 200, 1699999999, "c" * 64)
    record = {**member.record()}
    assert member.same_file(record)
    assert not member.same_file({**record, "sha256": "d" * 64})  # known sha differs
    assert not member.same_file({**record, "mtime": 1})


def test_a_set_destination_resumes_file_by_file():
    dest = Destination(LocalSide(), "/s/step_4000/checkpoint", "directory")
    probe = dest.state_probe()
    sections = {
        "manifest": "",
        "free": "Avail\n1000000\n",
        "final": "missing\n",
        "claim": "missing\n",
        "records": '{"name": "config.json", "size": 100, "mtime": 1700000000, '
        '"sha256": "' + "a" * 64 + '"}\n{"name": "torn',
        "sizes": "100 ./config.json\n50 ./model.safetensors.partial\n",
    }
    output = "".join(f"\n@@dflash-ops-section {name}\n{body}" for name, body in sections.items())
    state = probe.parse(output)
    assert dest.resume_offset(state, FILES[0]) is None  # verified already
    assert dest.resume_offset(state, FILES[1]) == 50  # resumes inside the file
    assert dest.writes_to(FILES[1]) == "/s/step_4000/checkpoint.partial/model.safetensors.partial"


def test_a_listing_refuses_names_that_leave_the_directory():
    lines = ["f 10 5 ./b", "f 20 6 ./a/c"]
    assert parse_listing(lines, "here") == (Member("a/c", 20, 6), Member("b", 10, 5))
    with pytest.raises(CheckpointError, match="leaves its directory"):
        parse_listing(["f 1 1 ./../etc/passwd"], "here")


def test_a_directorys_weight_files():
    names = [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model.safetensors.index.json",
        "optimizer.pt",
        "scheduler.pt",
        "trainer_state.json",
    ]
    kept = weight_members(tuple(Member(n, 1, 1) for n in names))
    assert [m.name for m in kept] == names[:3]


def test_the_trainer_script_uses_the_harness_definitions_of_the_weights():
    keys = harness_keys()
    assert keys["prefixes"] == weights.PREFIXES  # what the harness's checkpoint reader strips
    assert "model_state_dict" in keys["state_dict_keys"]
    assert "module." in keys["prefixes"] and "optimizer_state_dict" not in keys["metadata_keys"]
    assert keys["marker"] == "dflash_extract.json"  # what the harness's loader looks for
