"""Lab content: the tiny target + drafter checkpoints, and τ rising with the step."""

from __future__ import annotations

from pathlib import Path

from dflash_eval.contract.progress import Progress
from dflash_eval.run.evaluate import run_eval
from dflash_eval.run.options import EvalOptions

from dflash_lab.models import build_lab_models


def _quiet() -> Progress:
    return Progress(quiet=True)


def _files(directory: Path) -> dict[Path, int]:
    return {path: path.stat().st_mtime_ns for path in directory.rglob("*")}


def test_second_build_is_cached(lab):
    """A second build reuses the first: nothing of its build is written or added (the cache
    is the machine's: other builds, other keys, may come and go meanwhile)."""
    build = lab.target_dir.parent
    cache_dir = build.parent
    before, partial = _files(build), f"{build.name}."  # a build in progress: `<name>.*`
    before_partial = {p for p in cache_dir.iterdir() if p.name.startswith(partial)}
    again = build_lab_models(cache_dir)
    assert _files(build) == before
    assert {p for p in cache_dir.iterdir() if p.name.startswith(partial)} <= before_partial
    assert again == lab
    assert (lab.target_dir / "config.json").is_file()
    assert (lab.target_dir / "tokenizer.json").is_file()
    assert sorted(lab.checkpoints) == [2000, 4000, 6000]


def test_tau_rises_with_step_and_cache_hits_on_later_runs(lab, tmp_path):
    taus = {}
    results = {}
    for step, checkpoint in sorted(lab.checkpoints.items()):
        options = EvalOptions(
            checkpoint=checkpoint,
            target=lab.target_dir,
            out=tmp_path / f"step_{step}.json",
            threads=1,
            prompts=lab.prompts,
            max_new_tokens=96,
            cache_dir=tmp_path / "cache",
        )
        results[step] = run_eval(options, _quiet())
        taus[step] = results[step]["metrics"]["tau_macro"]
    assert taus[2000] < taus[4000] < taus[6000], taus
    assert taus[6000] > 1.8, taus
    first, later = results[2000]["per_prompt"], results[6000]["per_prompt"]
    assert not any(row["cache"]["completion"] or row["cache"]["hidden_states"] for row in first)
    assert all(row["cache"]["completion"] and row["cache"]["hidden_states"] for row in later)
    ddtree = results[6000]["metrics"]["ddtree"]
    tree_taus = [ddtree[b]["tau_macro"] for b in ("4", "8", "16", "32")]
    assert tree_taus == sorted(tree_taus)
