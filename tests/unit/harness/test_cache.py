"""The completion/hidden-state cache: a changed key is a miss, never a stale hit."""

from __future__ import annotations

import json

import torch
from dflash_eval.contract.progress import Progress
from dflash_eval.reference.cache import DiskCache, key_digest
from dflash_eval.run.evaluate import run_eval
from dflash_eval.run.options import EvalOptions

KEY = {"kind": "hidden_states", "target": "abc", "tokens": "t1", "layer_ids": [1, 3]}


def test_hidden_states_hit_only_for_the_same_key(tmp_path):
    cache = DiskCache(tmp_path)
    hidden = {1: torch.randn(5, 4), 3: torch.randn(5, 4)}
    assert cache.get_hidden(KEY) is None
    cache.put_hidden(KEY, hidden)
    again = cache.get_hidden(dict(KEY))
    assert again is not None and all(torch.equal(again[i], hidden[i]) for i in hidden)
    for changed in ({"layer_ids": [1, 2]}, {"target": "abd"}, {"tokens": "t2"}, {"dtype": "bf16"}):
        assert cache.get_hidden({**KEY, **changed}) is None


def test_an_entry_whose_stored_key_differs_is_a_miss(tmp_path):
    cache = DiskCache(tmp_path)
    cache.put_completion(KEY, [1, 2, 3])
    assert cache.get_completion(KEY) == [1, 2, 3]
    path = tmp_path / "completions" / f"{key_digest(KEY)}.json"
    entry = json.loads(path.read_text())
    entry["key"]["layer_ids"] = [9]  # as if written by other inputs under this name
    path.write_text(json.dumps(entry))
    assert cache.get_completion(KEY) is None
    path.write_text("{not json")
    assert cache.get_completion(KEY) is None


def test_has_hidden_answers_as_get_hidden_would_without_reading_the_tensors(tmp_path):
    """What `plan` counts: a hit exactly when get_hidden would return the entry."""
    cache = DiskCache(tmp_path)
    assert not cache.has_hidden(KEY)
    cache.put_hidden(KEY, {1: torch.ones(2, 4), 3: torch.zeros(2, 4)})
    assert cache.has_hidden(dict(KEY))
    other = {**KEY, "tokens": "t2"}
    assert not cache.has_hidden(other)
    # Another key's entry under this key's name (stale): a miss for both methods.
    path = tmp_path / "hidden" / f"{key_digest(KEY)}.safetensors"
    path.rename(path.with_name(f"{key_digest(other)}.safetensors"))
    assert not cache.has_hidden(other) and cache.get_hidden(other) is None
    path.with_name(f"{key_digest(other)}.safetensors").write_bytes(b"\x08not safetensors")
    assert not cache.has_hidden(other) and cache.get_hidden(other) is None
    assert not DiskCache(None).has_hidden(KEY)


def test_disabled_cache_never_hits(tmp_path):
    cache = DiskCache(None)
    cache.put_completion(KEY, [1])
    assert cache.get_completion(KEY) is None


def test_changed_run_inputs_miss_and_unchanged_ones_hit(lab, tmp_path):
    def run(max_new_tokens, checkpoint_step=6000):
        options = EvalOptions(
            checkpoint=lab.checkpoints[checkpoint_step],
            target=lab.target_dir,
            out=tmp_path / "r.json",
            threads=1,
            prompts=lab.prompts,
            num_prompts=2,
            max_new_tokens=max_new_tokens,
            cache_dir=tmp_path / "cache",
            ddtree=[],
        )
        rows = run_eval(options, Progress(quiet=True))["per_prompt"]
        return [(r["cache"]["completion"], r["cache"]["hidden_states"]) for r in rows]

    assert run(20) == [(False, False)] * 2
    assert run(20, checkpoint_step=2000) == [(True, True)] * 2  # same target, prompts, layers
    assert run(21) == [(False, False)] * 2  # a longer completion: new key, new tokens
