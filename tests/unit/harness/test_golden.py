"""The golden test: the numbers the harness computes on a fixed tiny fixture (golden.py) are
pinned, so a change that moves any of them fails here until the numerics version
(dflash_eval.contract.version.NUMERICS_VERSION) is raised, and results of the two versions stop
being compared as equals (docs/contributing.md, "When to raise the numerics version").

What is pinned is what results record: per prompt the completion length, the rounds, the
acceptance count of every slot, τ, DDTree τ and capped τ; the run's metrics and interval;
the decoded drafts; and at T > 0 the expectations, which are smooth functions of both
models' probabilities (so a change that moves a logit moves them even where it flips no
argmax). Counts and text are compared exactly, floats to RELATIVE (1e-4): every starting
weight comes from Python's portable random generator, the fixture's decisions have wide
margins, and a test here shows that noise a hundred times float32's rounding on every weight
moves no count and no float beyond RELATIVE, so thread counts, CPUs and library builds
leave the pins alone. The greedy run uses two threads and the sampled one a single thread.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from dflash_eval.contract.progress import Progress
from dflash_eval.contract.version import NUMERICS_VERSION
from dflash_eval.run.evaluate import run_eval
from dflash_eval.run.options import EvalOptions
from safetensors.torch import load_file, save_file

from . import golden

# The pinned numbers and the numerics version they belong to. DFLASH_GOLDEN_RECORD=1 rewrites
# the file from this run, and only after NUMERICS_VERSION was raised past the file's.
GOLDEN_FILE = Path(__file__).with_name("golden_numbers.json")
RECORD = os.environ.get("DFLASH_GOLDEN_RECORD") == "1"
RELATIVE = 1e-4
RUNS = ("greedy", "sampled")
SAMPLED = {"temperature": 0.8, "top_k": 8, "samples": 16}


def recorded() -> dict[str, Any]:
    return json.loads(GOLDEN_FILE.read_text())


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return golden.build(tmp_path_factory.mktemp("golden"))


def evaluate(fixture: tuple[Path, Path, Path], directory: Path, **options: Any) -> dict:
    target, checkpoint, prompts = fixture
    chosen = EvalOptions(
        checkpoint=checkpoint,
        target=target,
        out=directory / "results.json",
        prompts=prompts,
        max_new_tokens=40,
        ddtree=[2, 4],
        cache_dir=directory / "cache",
        **options,
    )
    return run_eval(chosen, Progress(quiet=True))


def pinned(results: dict) -> dict[str, Any]:
    """The numbers of a results record that the golden test holds fixed (not the samples:
    which rounds the report shows is presentation, and every drafted token is counted above)."""
    metrics = results["metrics"]
    rows = [
        {
            name: row[name]
            for name in (
                "completion_tokens",
                "reference_tokens",
                "stopped",
                "acceptance",
                "rounds",
                "tau",
                "ddtree_tau",
                "tau_capped",
            )
        }
        for row in results["per_prompt"]
    ]
    overall = results["by_dataset"]["overall"]
    return {
        "per_prompt": rows,
        "metrics": {
            name: metrics[name]
            for name in (
                "tau_macro",
                "tau_pooled",
                "rounds",
                "committed_tokens",
                "histogram",
                "per_position",
                "ddtree",
                "capped",
            )
        },
        "tau_macro_interval": overall["tau_macro"],
    }


def moved(found: Any, expected: Any, path: str = "") -> list[str]:
    """Where `found` differs from `expected`: counts and text exactly, floats to RELATIVE."""
    if isinstance(expected, dict) and isinstance(found, dict):
        names = sorted(set(expected) | set(found))
        return [
            line
            for name in names
            for line in moved(found.get(name), expected.get(name), f"{path}.{name}")
        ]
    if isinstance(expected, list) and isinstance(found, list) and len(found) == len(expected):
        return [
            line
            for index, (one, other) in enumerate(zip(found, expected, strict=True))
            for line in moved(one, other, f"{path}[{index}]")
        ]
    if isinstance(expected, float) and isinstance(found, float):
        close = math.isclose(found, expected, rel_tol=RELATIVE, abs_tol=1e-12)
        return [] if close else [f"{path}: {expected!r} → {found!r}"]
    return (
        []
        if found == expected and type(found) is type(expected)
        else [f"{path}: {expected!r} → {found!r}"]
    )


def require_golden(found: dict[str, Any], run: str) -> None:
    """`found` must be the recorded numbers of `run` (or, when recording, is written)."""
    golden = recorded()
    if RECORD:
        record(golden, found, run)
        return
    changes = moved(found, golden[run])
    if not changes:
        return
    shown = "\n  ".join(changes[:20]) + (f"\n  … {len(changes) - 20} more" if changes[20:] else "")
    pytest.fail(
        f"the {run} numbers of the golden fixture moved under numerics version "
        f"{NUMERICS_VERSION}:\n  {shown}\nIf this change is meant to change the numbers, raise "
        f"NUMERICS_VERSION in remote/dflash_eval/contract/version.py to {NUMERICS_VERSION + 1} and "
        "record the new numbers: DFLASH_GOLDEN_RECORD=1 pytest tests/unit/harness/test_golden.py "
        "(docs/contributing.md). If it is not, the change has a numerical side effect: find "
        "it before merging.",
        pytrace=False,
    )


def record(golden: dict[str, Any], found: dict[str, Any], run: str) -> None:
    """Write `run`'s numbers as those of NUMERICS_VERSION: only into a file of an older
    version (started afresh) or one that lacks them; never over numbers already pinned."""
    if golden["numerics_version"] == NUMERICS_VERSION and run in golden:
        pytest.fail(
            f"{GOLDEN_FILE.name} already holds numerics version {NUMERICS_VERSION}'s {run} "
            "numbers: raise NUMERICS_VERSION before recording new ones",
            pytrace=False,
        )
    if golden["numerics_version"] != NUMERICS_VERSION:
        golden = {"numerics_version": NUMERICS_VERSION}
    golden[run] = found
    GOLDEN_FILE.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")


def numbers(fixture: tuple[Path, Path, Path], directory: Path) -> dict[str, dict[str, Any]]:
    """The pinned numbers of the fixture's greedy and sampled runs."""
    greedy = evaluate(fixture, directory / "greedy", threads=2)
    assert greedy["harness"]["numerics_version"] == NUMERICS_VERSION
    sampled = evaluate(fixture, directory / "sampled", threads=1, **SAMPLED)
    monte_carlo = sampled["metrics"]["sampling"]["monte_carlo"]
    interval = sampled["metrics"]["sampling"]["interval"]  # over prompts and paths
    return {
        "greedy": pinned(greedy),
        "sampled": {**pinned(sampled), "monte_carlo": monte_carlo, "interval": interval},
    }


@pytest.fixture(scope="module")
def found(fixture, tmp_path_factory) -> dict[str, dict[str, Any]]:
    return numbers(fixture, tmp_path_factory.mktemp("runs"))


@pytest.mark.parametrize("run", RUNS)
def test_the_numbers_of_the_golden_fixture_are_pinned(found, run):
    require_golden(found[run], run)


def test_noise_far_beyond_a_platforms_moves_no_pinned_number(fixture, found, tmp_path):
    """Every weight of both models × (1 + 1e-5·N(0, 1)), a hundred times float32's rounding:
    no count moves and no expectation beyond RELATIVE, so another CPU, thread count or
    library build leaves the pins alone (while a change of the maths moves them)."""
    target, checkpoint, prompts = fixture
    noisy_target = tmp_path / "target"
    shutil.copytree(target, noisy_target)
    draw = torch.Generator().manual_seed(golden.SEED)

    def noisy(tensor: torch.Tensor) -> torch.Tensor:
        return tensor * (1 + 1e-5 * torch.randn(tensor.shape, generator=draw))

    weights = noisy_target / "model.safetensors"
    save_file({k: noisy(t) for k, t in load_file(weights).items()}, weights, {"format": "pt"})
    saved = torch.load(checkpoint, weights_only=True)
    saved["model_state_dict"] = {k: noisy(t) for k, t in saved["model_state_dict"].items()}
    noisy_checkpoint = tmp_path / "step_100" / "checkpoint.pt"
    noisy_checkpoint.parent.mkdir()
    torch.save(saved, noisy_checkpoint)
    noisy_numbers = numbers((noisy_target, noisy_checkpoint, prompts), tmp_path)
    assert moved(noisy_numbers, found) == []


def test_the_golden_numbers_belong_to_the_current_numerics_version():
    golden = recorded()
    assert golden["numerics_version"] == NUMERICS_VERSION and set(RUNS) <= set(golden), (
        f"NUMERICS_VERSION is {NUMERICS_VERSION} but {GOLDEN_FILE.name} holds version "
        f"{golden['numerics_version']}'s numbers: record this version's "
        "(DFLASH_GOLDEN_RECORD=1 pytest tests/unit/harness/test_golden.py)"
    )
