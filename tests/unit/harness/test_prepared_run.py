"""The run's decisions made once (run/prepared.py): greedy or sampled, the sequences per prompt,
the DDTree budgets the intervals cover, the threads and the prompts, from the options alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dflash_eval.contract.errors import HarnessError
from dflash_eval.run.options import EvalOptions
from dflash_eval.run.prepared import prepare
from dflash_eval.target.device import resolve_device


def options(tmp_path: Path, **overrides) -> EvalOptions:
    # prepare reads no checkpoint and no target: the paths need not exist.
    return EvalOptions(
        checkpoint=tmp_path / "ckpt",
        target=tmp_path / "target",
        out=tmp_path / "r.json",
        **overrides,
    )


def test_a_greedy_run_walks_one_sequence_per_prompt_and_measures_its_ddtree(tmp_path):
    run = prepare(options(tmp_path, ddtree=[4, 8], num_prompts=2), 8, resolve_device)
    assert (run.sampled, run.paths, run.ddtree_budgets) == (False, 1, [4, 8])
    assert len(run.prompts) == 2 and run.threads == 6  # 8 cores less the reserve of 2
    assert run.record() == {
        "mode": "greedy",
        "sampling": None,
        "paths": 1,
        "threads": 6,
        "device": "cpu",
    }


def test_a_sampled_run_walks_its_paths_and_measures_no_ddtree(tmp_path):
    chosen = options(tmp_path, temperature=0.7, top_k=20, paths=3, ddtree=[4], threads=3)
    run = prepare(chosen, 64, resolve_device)
    assert (run.sampled, run.paths, run.ddtree_budgets, run.threads) == (True, 3, [], 3)
    assert run.record()["sampling"]["temperature"] == 0.7
    assert run.record()["mode"] == "sampled"
    # Settling the budgets once the drafters are loaded keeps every decision made.
    settled = run.with_ddtree([2])
    assert settled.sampling == run.sampling and settled.options.ddtree == [2]
    assert run.options.ddtree == [4]  # the prepared value itself is not changed


def test_options_that_cannot_be_run_are_refused_before_anything_is_decided(tmp_path):
    with pytest.raises(HarnessError, match="--sglang-url"):
        prepare(
            options(tmp_path, temperature=0.5, sglang_url="http://127.0.0.1:1"), 2, resolve_device
        )
    with pytest.raises(HarnessError, match="--num-prompts"):
        prepare(options(tmp_path, num_prompts=0), 2, resolve_device)
    with pytest.raises(HarnessError, match="--num-prompts 999"):
        prepare(options(tmp_path, num_prompts=999), 2, resolve_device)


def test_preparing_a_run_loads_neither_torch_nor_transformers():
    probe = (
        "import json, sys; import dflash_eval.run.prepared; print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = json.loads(done.stdout)
    assert "dflash_eval.walk.sampling_settings" in loaded
    assert [name for name in loaded if name.split(".")[0] in ("torch", "transformers")] == []
