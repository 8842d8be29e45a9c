"""The one reader of files read back (core/records.py): bounded, typed, one line per fault;
and the readers built on it (manifests, the --prompts check) on hostile files."""

from __future__ import annotations

import pytest

from dflash_ops.core.records import (
    RecordError,
    check_json_lines,
    parse_json,
    parse_record,
)
from dflash_ops.evaluation.records import RunParams
from dflash_ops.staging.destination import Destination
from dflash_ops.staging.sides import LocalSide


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper than 32 levels"),
        ('{"a": ' * 40 + "1" + "}" * 40, "nested deeper than 32 levels"),
        (b'{"a": "\xff"}', "not UTF-8 text (byte 7)"),
        ("x" * (1 << 20), "1048576 bytes, more than the 1000000 a record may hold"),
        ('{"a": 1', "not valid JSON"),
    ],
)
def test_a_file_beyond_the_bounds_is_one_line(text, why):
    with pytest.raises(RecordError, match=r"^params\.json: ") as refused:
        parse_json(text, "params.json", max_bytes=1_000_000)
    assert why in str(refused.value)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"started": "yesterday"}', "started: input should be a valid number, found 'yesterday'"),
        ('{"started": Infinity}', "started: input should be a finite number"),
        ('{"step": true}', "step: input should be a valid integer"),
        ('{"step": 4000.5}', "step: input should be a valid integer"),
        ("[]", "expected a JSON object, found list"),
    ],
)
def test_a_record_with_a_field_of_the_wrong_type_names_it(text, why):
    with pytest.raises(RecordError) as refused:
        parse_record(text, "params.json", RunParams)
    assert why in str(refused.value)


def test_unknown_keys_pass_and_known_ones_come_back_typed():
    record = parse_record('{"step": 4000, "started": 1, "extra": [1]}', "p", RunParams)
    assert (record.step, record.started, record.model_extra) == (4000, 1.0, {"extra": [1]})


def test_a_deep_manifest_counts_as_none_and_the_copy_is_redone():
    dest = Destination(LocalSide(), "/s/step_4000/checkpoint.pt", "file")
    probe = dest.state_probe()
    deep = "[" * 100_000 + "]" * 100_000
    sections = {
        "manifest": deep,
        "free": "Avail\n1000\n",
        "final": "missing\n",
        "claim": "missing\n",
        "partial": "missing\n",
    }
    output = "".join(f"\n@@dflash-ops-section {name}\n{body}" for name, body in sections.items())
    assert probe.parse(output).manifest is None


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"id": "a", "prompt": "caf\xe9"}\n', "line 1: not UTF-8 text (the byte 0xe9)"),
        (b'{"id": "a"}\n\n[1]\n', "line 3: expected a JSON object, found list"),
        (b'{"id": "a"}\n{"id": \n', "line 2: not valid JSON"),
        (b"\n\n", "no records"),
    ],
)
def test_a_prompts_file_is_utf8_json_lines_or_one_line(tmp_path, content, why):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(content)
    with pytest.raises(RecordError, match=f"^--prompts {path}: ") as refused:
        check_json_lines(path, "--prompts")
    assert why in str(refused.value)
    path.write_bytes(b'{"id": "a", "prompt": "caf\xc3\xa9"}\n\n{"id": "b", "prompt": "x"}\n')
    assert check_json_lines(path, "--prompts") == 2
