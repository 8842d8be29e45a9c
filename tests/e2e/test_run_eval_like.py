"""`fab run-eval --like RUN_ID` end to end on the shared provisioned lab: a run with its own
prompts and options, then the same run again named only by its short id (its prompts file
deleted from the workstation: they come back from the eval host), and `fab compare` puts the
two in one comparability group with equal numbers."""

from __future__ import annotations

import json

import pytest

from dflash_ops.core.inventory import load
from dflash_ops.evaluation.run_ids import short_ids
from tests.conftest import run_fab
from tests.e2e.conftest import one_eval_host

pytestmark = pytest.mark.slow

PROMPTS = ("the quick brown fox jumps", "def add(a, b): return", "SELECT name FROM users")
OPTIONS = ["--num-prompts", "2", "--max-new-tokens", "24", "--ddtree", "4", "--seed", "3"]


@pytest.fixture
def models_lab(e2e_lab, tmp_path):
    """The shared e2e lab as a trainer and one eval host (put back as built afterwards)."""
    return one_eval_host(e2e_lab, tmp_path)


def test_a_run_repeated_like_another_lands_in_its_group_with_equal_numbers(models_lab, tmp_path):
    inventory = models_lab.inventory_path
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS))
    )
    first = run_fab(
        inventory, "run-eval", "--step", "4000", "--prompts", str(prompts), "--tag", "t", *OPTIONS
    )
    assert first.returncode == 0, first.stdout + first.stderr
    prompts.unlink()  # --like fetches the run's own copy from the eval host
    results_root = load(inventory).local.results
    (first_id,) = [path.parent.name for path in results_root.glob("*/results.json")]
    short = short_ids([first_id])[first_id]

    planned = run_fab(inventory, "run-eval", "--like", short, "--dry-run")
    assert planned.returncode == 1
    assert f"--dry-run with --like {first_id} is not supported: its prompts.jsonl" in planned.stderr

    again = run_fab(inventory, "run-eval", "--like", short)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"like {first_id}: step 4000, options " in again.stdout
    assert "--max-new-tokens 24" in again.stdout and "its prompts from eval" in again.stdout

    compared = run_fab(inventory, "compare", "--format", "json")
    assert compared.returncode == 0, compared.stderr
    document = json.loads(compared.stdout)
    (second_id,) = {row["run_id"] for row in document["runs"]} - {first_id}
    assert [sorted(group["runs"]) for group in document["groups"]] == [
        sorted([first_id, second_id])
    ]
    runs = {row["run_id"]: row for row in document["runs"]}
    numbers = ("tau_macro", "tau_pooled", "tree_4", "acc_1", "acc_2", "step", "tag")
    assert {name: runs[first_id][name] for name in numbers} == {
        name: runs[second_id][name] for name in numbers
    }
    per_set = {
        (row["run_id"], row["prompt_set"], row["metric"]): row["value"]
        for row in document["per_set"]
    }
    assert per_set and all(
        per_set[(second_id, *rest)] == value
        for (run, *rest), value in per_set.items()
        if run == first_id
    )
    recorded = [
        json.loads((results_root / run / "results.json").read_text())
        for run in (first_id, second_id)
    ]
    assert recorded[0]["prompts"]["sha256"] == recorded[1]["prompts"]["sha256"]
    assert recorded[0]["prompts"]["count"] == 2
    for name in ("num_prompts", "max_new_tokens", "ddtree", "seed", "threads", "block_size"):
        assert recorded[0]["options"][name] == recorded[1]["options"][name], name
