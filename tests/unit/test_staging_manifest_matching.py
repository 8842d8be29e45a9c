"""When a staged single file counts as a copy of the trainer's checkpoint: every recorded
field of the source must agree, the digest must be there, and the kind must be a file."""

from __future__ import annotations

from dflash_ops.staging.manifest import Identity, file_manifest, matches

IDENTITY = Identity("trainer", "/ckpt/step_4000/checkpoint.pt", 1234, 1700000000, 4000)


def test_a_file_manifest_records_the_source_the_digest_and_how():
    manifest = file_manifest(IDENTITY, "ab" * 32, "trainer:/ckpt (stream)")
    assert {k: manifest[k] for k in ("source_host", "source_path", "size", "mtime", "step")} == {
        "source_host": "trainer",
        "source_path": "/ckpt/step_4000/checkpoint.pt",
        "size": 1234,
        "mtime": 1700000000,
        "step": 4000,
    }
    assert manifest["sha256"] == "ab" * 32 and manifest["staged_via"] == "trainer:/ckpt (stream)"
    assert manifest["staged_at"]
    assert matches(manifest, IDENTITY, "file", ())


def test_every_source_field_must_agree():
    manifest = file_manifest(IDENTITY, "ab" * 32, "x")
    for key, other in (
        ("source_host", "trainer2"),
        ("source_path", "/ckpt/other.pt"),
        ("size", 1235),
        ("mtime", 1700000001),
        ("step", 4001),
    ):
        assert not matches({**manifest, key: other}, IDENTITY, "file", ())


def test_a_manifest_without_a_digest_or_of_another_kind_is_no_copy():
    manifest = file_manifest(IDENTITY, "ab" * 32, "x")
    assert not matches({**manifest, "sha256": None}, IDENTITY, "file", ())
    assert not matches({k: v for k, v in manifest.items() if k != "sha256"}, IDENTITY, "file", ())
    assert not matches({**manifest, "kind": "directory"}, IDENTITY, "file", ())
    assert matches({**manifest, "kind": "file"}, IDENTITY, "file", ())
    assert not matches(manifest, IDENTITY, "directory", ())  # a file is no directory copy
    assert not matches(manifest, IDENTITY, "extracted", ())
    assert not matches(None, IDENTITY, "file", ())
