"""The cache's addressing and its edges: a stale hidden-state entry, a disabled cache, key
order, fresh directories, and no file descriptor left open."""

from __future__ import annotations

import hashlib
import json
import os

import torch
from dflash_eval.reference.cache import DiskCache, key_digest, tokens_digest
from safetensors.torch import save_file

KEY = {"kind": "hidden_states", "target": "abc", "tokens": "t1", "layer_ids": [1, 3]}


def hidden_states() -> dict[int, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {1: torch.randn(5, 4, generator=generator), 3: torch.randn(5, 4, generator=generator)}


def open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_an_entry_is_addressed_by_the_sorted_key_with_the_cache_format():
    # The address must not change between harness versions (or a redeploy loses the cache)
    # nor with the order a caller happened to build the key in.
    canonical = json.dumps({"cache_format": 1, **KEY}, sort_keys=True)
    assert key_digest(KEY) == hashlib.sha256(canonical.encode()).hexdigest()
    assert key_digest(dict(reversed(KEY.items()))) == key_digest(KEY)
    assert key_digest({**KEY, "tokens": "t2"}) != key_digest(KEY)


def test_tokens_digest_depends_on_the_tokens_and_their_order():
    digest = tokens_digest([5, 6, 7])
    assert digest == hashlib.sha256(b"[5, 6, 7]").hexdigest()
    assert tokens_digest([7, 6, 5]) != digest


def test_key_order_does_not_matter_for_hits(tmp_path):
    cache = DiskCache(tmp_path)
    reordered = dict(reversed(KEY.items()))
    cache.put_hidden(KEY, hidden_states())
    cache.put_completion(KEY, [4, 5])
    assert cache.get_hidden(reordered) is not None
    assert cache.get_completion(reordered) == [4, 5]


def test_a_hidden_state_entry_whose_stored_key_differs_is_a_miss(tmp_path):
    cache = DiskCache(tmp_path)
    cache.put_hidden(KEY, hidden_states())
    (path,) = (tmp_path / "hidden").iterdir()
    # As if other inputs had been written under this name: same file, another stored key.
    other = json.dumps({"cache_format": 1, **KEY, "layer_ids": [9]}, sort_keys=True)
    save_file({"1": torch.zeros(5, 4)}, str(path), metadata={"key": other})
    assert cache.get_hidden(KEY) is None
    save_file({"1": torch.zeros(5, 4)}, str(path))  # no stored key at all
    assert cache.get_hidden(KEY) is None


def test_hidden_states_round_trip_every_layer_exactly(tmp_path):
    cache = DiskCache(tmp_path)
    stored = hidden_states()
    cache.put_hidden(KEY, stored)
    again = cache.get_hidden(KEY)
    assert again is not None and sorted(again) == [1, 3]
    assert all(torch.equal(again[layer], stored[layer]) for layer in stored)


def test_a_disabled_cache_writes_nothing_and_never_hits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cache = DiskCache(None)
    cache.put_hidden(KEY, hidden_states())
    cache.put_completion(KEY, [1, 2])
    assert cache.get_hidden(KEY) is None
    assert cache.get_completion(KEY) is None
    assert list(tmp_path.iterdir()) == []


def test_a_cache_root_that_does_not_exist_yet_is_created_with_its_parents(tmp_path):
    for_completions, for_hidden = DiskCache(tmp_path / "a" / "b"), DiskCache(tmp_path / "c" / "d")
    for_completions.put_completion(KEY, [1])
    for_hidden.put_hidden(KEY, hidden_states())
    assert for_completions.get_completion(KEY) == [1]
    assert for_hidden.get_hidden(KEY) is not None


def test_entries_are_rewritten_in_place_and_leave_no_partials(tmp_path):
    cache = DiskCache(tmp_path)
    for value in ([1], [2]):
        cache.put_completion(KEY, value)
        cache.put_hidden(KEY, {1: torch.full((2, 2), float(value[0]))})
    assert cache.get_completion(KEY) == [2]
    assert torch.equal(cache.get_hidden(KEY)[1], torch.full((2, 2), 2.0))
    leftovers = [p.name for p in tmp_path.rglob("*.partial")]
    assert leftovers == []


def test_writes_leave_no_file_descriptor_open(tmp_path):
    cache = DiskCache(tmp_path)
    cache.put_hidden(KEY, hidden_states())  # the first write imports what it needs
    cache.put_completion(KEY, [1])
    before = open_descriptors()
    for layer in range(3):
        cache.put_hidden({**KEY, "layer_ids": [layer]}, hidden_states())
        cache.put_completion({**KEY, "layer_ids": [layer]}, [layer])
    assert open_descriptors() == before


def test_a_missing_or_unreadable_entry_is_a_miss(tmp_path):
    cache = DiskCache(tmp_path)
    assert cache.get_hidden(KEY) is None
    assert cache.get_completion(KEY) is None
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / f"{key_digest(KEY)}.safetensors").write_bytes(b"not safetensors")
    assert cache.get_hidden(KEY) is None


def test_records_round_trip_per_kind_and_key(tmp_path):
    cache = DiskCache(tmp_path)
    assert cache.get_record("features", KEY) is None
    cache.put_record("features", KEY, {"fidelity": 0.5})
    assert cache.get_record("features", dict(reversed(KEY.items()))) == {"fidelity": 0.5}
    assert cache.get_record("other", KEY) is None
    assert cache.get_record("features", {**KEY, "tokens": "t2"}) is None


def test_a_record_whose_stored_key_differs_or_is_damaged_is_a_miss(tmp_path):
    cache = DiskCache(tmp_path)
    cache.put_record("features", KEY, {"fidelity": 0.5})
    path = tmp_path / "features" / f"{key_digest(KEY)}.json"
    entry = json.loads(path.read_text())
    entry["key"]["layer_ids"] = [9]
    path.write_text(json.dumps(entry))
    assert cache.get_record("features", KEY) is None
    path.write_text("{not json")
    assert cache.get_record("features", KEY) is None


def test_a_disabled_cache_keeps_no_records(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cache = DiskCache(None)
    cache.put_record("features", KEY, {"fidelity": 0.5})
    assert cache.get_record("features", KEY) is None
    assert list(tmp_path.iterdir()) == []
