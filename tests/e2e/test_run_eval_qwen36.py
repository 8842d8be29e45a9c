"""`fab run-eval` end to end on the miniature Qwen3.6 target (`dflash-lab up --content qwen3.6`): a
vision-language wrapper with hybrid attention, MTP weights and bf16 shards, on a provisioned
eval host over real SSH; drafters trained on it at steps 2000/4000/6000 and a reference
drafter with causal sliding-window layers."""

from __future__ import annotations

import json

import pytest

from dflash_lab import lab as labs
from dflash_ops.core.inventory import load
from tests.conftest import provisioned_models_lab, run_fab

pytestmark = pytest.mark.long(130)  # seconds in a cold `make test` (5 workers)


QUICK = ["--num-prompts", "3", "--max-new-tokens", "32", "--ddtree", "4,8"]


@pytest.fixture(scope="module")
def qwen36_lab(tmp_path_factory):
    yield from provisioned_models_lab(
        tmp_path_factory, labs.qwen36_models, eval_hosts=1, steps=(2000, 4000, 6000)
    )


def pulled_results(inventory_path) -> dict[int, dict]:
    """Each pulled run's results, by step."""
    found = {}
    for results_file in load(inventory_path).local.results.glob("*/results.json"):
        results = json.loads(results_file.read_text())
        found[results["checkpoint"]["step"]] = results
    return found


def test_a_sweep_with_the_reference_on_the_miniature_qwen36(qwen36_lab):
    inventory_path = qwen36_lab.inventory_path
    sweep = run_fab(
        inventory_path,
        "run-eval",
        "--steps",
        "2000,4000,6000",
        "--reference",
        "--prompts",
        str(qwen36_lab.root / labs.LAB_PROMPTS),
        *QUICK,
        timeout=900,
    )
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    results = pulled_results(inventory_path)
    assert sorted(results) == [2000, 4000, 6000]
    for each in results.values():
        target = each["target"]
        assert target["family"] == "qwen3_5 (vision-language wrapper)"
        assert target["num_layers"] == 8 and target["name"] == "qwen3.6-mini"
        shards = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
        assert [name for name in target["files"] if name.endswith(".safetensors")] == shards
        features = each["features"]
        assert features["dtype"] == "float32"
        assert features["dtype_source"] == "auto: float32 for linear attention on CPU"
        assert features["kernel"]["linear_attention"] == "torch fallback"
        assert each["prompts"]["chat_template"] and each["prompts"].get("thinking", "off") == "off"
        attention = each["reference"]["drafter"]["attention"]
        assert [(a["kind"], a["causal"]) for a in attention] == [
            ("sliding_attention", True),
            ("sliding_attention", True),
            ("full_attention", False),
        ]
    tau = [results[step]["metrics"]["tau_macro"] for step in (2000, 4000, 6000)]
    assert tau == sorted(tau) and tau[0] < tau[-1], tau  # really trained: τ rises with steps
    compared = run_fab(inventory_path, "compare", "--format", "json")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    runs = json.loads(compared.stdout)["runs"]
    assert sorted(run["step"] for run in runs) == [2000, 4000, 6000]
    assert all(run["comparable"] and run["reference_tau"] > 1 for run in runs)
