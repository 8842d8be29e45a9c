"""A dry run imports no torch (issue 33): the harness's process entry (cli.entry: `python -m
dflash_eval`, and the workstation's in-memory loader) hides torch from `plan`, so any import of
it fails; so run, it plans a training checkpoint, a Hugging Face drafter directory and a
diagnosis as the in-process plan (which reads them with the same code) does. Nothing the dry
run's modules import at their top loads torch, transformers or safetensors.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dflash_eval.diagnose.dry_run import make_diagnose_plan
from dflash_eval.plan.dry_run import make_plan
from dflash_eval.run.options import EvalOptions
from dflash_eval.target.device import resolve_device, resolve_device_without_torch
from dflash_eval.target.dtype import dtype_key
from dflash_eval.target.model import DTYPES

from .test_plan import options

REMOTE = Path(__file__).resolve().parents[3] / "remote"
HEAVY = ("torch", "transformers", "safetensors")
# What depends on the moment (free memory) or on where the plan ran.
MOMENT = ("host", "estimate")


def dry_run(*args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "dflash_eval", "plan", *args],
        cwd=REMOTE,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "PyTorch was not found" not in result.stderr  # transformers' advice, filtered
    [event] = [json.loads(line) for line in result.stdout.splitlines()]
    return event["plan"]


def steady(plan: dict) -> dict:
    kept = {key: value for key, value in plan.items() if key not in MOMENT}
    kept["target"] = {k: v for k, v in plan["target"].items() if k != "fits"}
    return kept


def argv(chosen: EvalOptions) -> list[str]:
    given = ["--checkpoint", str(chosen.checkpoint), "--target", str(chosen.target)]
    given += ["--prompts", str(chosen.prompts), "--num-prompts", str(chosen.num_prompts)]
    given += ["--max-new-tokens", str(chosen.max_new_tokens)]
    given += ["--cache-dir", str(chosen.cache_dir), "--ddtree", ",".join(map(str, chosen.ddtree))]
    if chosen.reference_drafter is not None:
        given += ["--reference-drafter", str(chosen.reference_drafter)]
    return given


@pytest.fixture
def hf_drafter(lab, tmp_path) -> Path:
    """The lab's step-2000 drafter as a Hugging Face directory (config + safetensors)."""
    from dflash_eval.run.export import ExportOptions, export_drafter

    out = tmp_path / "hf-2000"
    export_drafter(ExportOptions(lab.checkpoints[2000], lab.target_dir, out))
    return out


def test_a_plan_without_torch_is_the_plan(lab, tmp_path, hf_drafter):
    chosen = options(lab, tmp_path, num_prompts=2, reference_drafter=hf_drafter)
    planned = dry_run(*argv(chosen))
    assert planned["drafter"]["source"] == "checkpoint"
    assert planned["reference_drafter"]["source"] == "checkpoint"
    assert planned["drafter"]["parameters"] > 0 and planned["problems"] == []
    assert steady(planned) == steady(json.loads(json.dumps(make_plan(chosen))))


def test_a_diagnose_plan_without_torch_is_the_plan(lab, tmp_path):
    chosen = options(
        lab, tmp_path, checkpoint=lab.checkpoints[2000], reference_drafter=lab.checkpoints[6000]
    )
    planned = dry_run(*argv(chosen), "--diagnose")
    assert planned["diagnose"]["labels"]
    expected = json.loads(json.dumps(make_diagnose_plan(chosen)))
    assert steady(planned) == {**steady(expected), "diagnose": planned["diagnose"]}
    assert planned["diagnose"]["labels"] == expected["diagnose"]["labels"]


def test_the_dry_runs_modules_load_no_torch():
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, dflash_eval.cli, dflash_eval.plan.dry_run, dflash_eval.diagnose.dry_run;"
            "print(' '.join(sorted(sys.modules)))",
        ],
        cwd=REMOTE,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert [name for name in loaded if name.split(".")[0] in HEAVY] == []


def test_what_the_dry_run_decides_without_torch_is_what_torch_decides():
    for name, dtype in DTYPES.items():
        assert dtype_key(name) == str(dtype)  # the cache keys' dtype: old entries still hit
    for requested in ("auto", "cpu", "cuda"):
        try:
            expected = resolve_device(requested)
        except Exception as refusal:
            with pytest.raises(type(refusal), match="sees no CUDA device"):
                resolve_device_without_torch(requested)
        else:
            assert resolve_device_without_torch(requested) == expected
