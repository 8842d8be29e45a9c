"""`fab run-eval --like RUN_ID` without hosts: which pulled run is named, what of it is
repeated, and that the repeated argv means the same run to the harness (the lab's end-to-end
run is tests/e2e/test_run_eval_like.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dflash_eval.cli import _eval_options
from dflash_eval.contract.parser import build_parser
from dflash_eval.run.record import options_record

from dflash_ops.core.errors import OpsError
from dflash_ops.evaluation import like
from dflash_ops.evaluation.harness_options import harness_args
from dflash_ops.evaluation.results import load_runs
from tests.schema_samples import results_dict

RUN_ID = "20261201-120000-step4000-eval-3f2a"
REQUIRED = ["--checkpoint", "/staged/step_4000", "--target", "/models/t", "--out", "r.json"]


def recorded_options(*flags: str) -> dict:
    """The `options` record a harness run with these flags writes."""
    args = build_parser().parse_args(["eval", *REQUIRED, *flags])
    return options_record(_eval_options(args, {}))


def pull(root: Path, run_id: str, results: dict | None, tag: str | None = None) -> None:
    directory = root / run_id
    directory.mkdir(parents=True)
    state = "succeeded" if results else "failed"
    run = {"run_id": run_id, "host": "eval", "state": state, "tag": tag, "started": 1}
    (directory / "run.json").write_text(json.dumps(run))
    if results:
        (directory / "results.json").write_text(json.dumps(results))


def sample(*flags: str) -> dict:
    made = results_dict()
    made["checkpoint"]["step"] = 4000
    made["options"] = recorded_options(*flags)
    return made


def test_the_run_is_named_by_its_short_id_among_the_successful_pulled_runs(tmp_path):
    with pytest.raises(OpsError, match=r"^--like: no successful runs pulled into .*fetch-results"):
        like.find(tmp_path, "3f2a")
    pull(tmp_path, RUN_ID, sample())
    pull(tmp_path, "20261201-130000-step6000-eval-9bcd", None)  # failed: no parameters to take
    assert like.find(tmp_path, "3f2a").run_id == RUN_ID
    with pytest.raises(
        OpsError, match=r"no run id among the successful runs in .* contains '9bcd'"
    ):
        like.find(tmp_path, "9bcd")


def test_every_option_the_run_had_is_repeated_and_means_the_same_run_to_the_harness(tmp_path):
    flags = [
        "--num-prompts", "3", "--max-new-tokens", "24", "--ddtree", "", "--thinking", "on",
        "--target-layer-ids", "1,4", "--threads", "2", "--no-cache", "--per-block",
        "--temperature", "0.5", "--seed", "7", "--prompts", "/runs/.prompts.jsonl-x",
    ]  # fmt: skip
    pull(tmp_path, RUN_ID, sample(*flags), tag="nightly")
    found = like.liked(load_runs(tmp_path)[0])
    assert (found.step, found.host, found.training_run, found.features) == (
        4000,
        "eval",
        None,
        None,
    )
    assert found.remote_files == {"prompts": "/runs/.prompts.jsonl-x"}
    harness = found.options["harness_options"]
    assert harness["no_cache"] is True and harness["ddtree"] == []  # '' (none) is not the default
    assert "max_blocks" not in harness and "top_p" not in harness  # unset or the default
    assert harness["completions"] == "local"  # as the run had them, whatever the inventory says
    assert found.options | {"harness_options": None} == {
        "harness_options": None,
        "reference": False,
        "strip_optimizer": False,
        "tag": "nightly",
    }
    again = build_parser().parse_args(
        ["eval", *REQUIRED, "--prompts", "/runs/.prompts.jsonl-x", *harness_args(harness)]
    )
    assert options_record(_eval_options(again, {})) == recorded_options(*flags)


def test_a_flag_given_beside_like_overrides_what_the_run_had():
    liked = {"harness_options": {"max_new_tokens": 24, "seed": 7}, "tag": "a", "reference": True}
    given = {
        "harness_options": {"max_new_tokens": "64", "seed": None, "per_block": False},
        "tag": None,
        "reference": False,
        "prompts": "mine.jsonl",
        "via": "stream",
    }
    assert like.merged(liked, given) == {
        "harness_options": {"max_new_tokens": "64", "seed": 7},
        "tag": "a",
        "reference": True,
        "prompts": "mine.jsonl",
        "via": "stream",
    }


def test_a_run_without_a_step_asks_for_one(tmp_path):
    made = sample()
    made["checkpoint"]["step"] = None
    pull(tmp_path, RUN_ID, made)
    with pytest.raises(OpsError, match=f"--like {RUN_ID}: its results record no step; pass --step"):
        like.liked(load_runs(tmp_path)[0])
