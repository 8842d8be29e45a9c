"""`diagnose` on faulty lab drafters (dflash_lab/faulty.py): the injected cause ranks first.

The other drafter is the lab's own step-6000 checkpoint (trained as the faulty ones are,
without the fault); each repair is tried on every prompt of the lab.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from dflash_eval.cli import main
from dflash_eval.contract.diagnose_summary import report_section, summary_lines
from dflash_eval.contract.progress import Progress
from dflash_eval.diagnose.diagnosis import DiagnoseOptions, run_diagnose
from dflash_eval.diagnose.dry_run import make_diagnose_plan
from dflash_eval.diagnose.repairs import attention_settings, dtype_settings, repair_settings
from dflash_eval.diagnose.stats import paired_difference
from dflash_eval.target.dtype import float32_shortfall
from safetensors import safe_open

from dflash_lab.faulty import build_faulty_drafter, edited_drafter
from tests.unit.harness.helpers import (
    diagnose_lab,
    diagnose_options,
    random_drafter,
    save_tiny_qwen3_5,
    save_training_checkpoint,
    small_config,
)
from tests.unit.harness.test_plan import facts as plan_facts

pytestmark = pytest.mark.long(175)  # seconds in a cold `make test` (5 workers)


def _diagnose(lab, tmp_path, candidate):
    return diagnose_lab(lab, tmp_path, candidate, lab.checkpoints[6000])


def plan_diagnose(lab, root, candidate):
    """`plan --diagnose` of the same run, which writes nothing."""
    root.mkdir()
    plan = make_diagnose_plan(diagnose_options(lab, root, candidate, lab.checkpoints[6000]))
    assert list(root.iterdir()) == []
    part = plan["diagnose"]
    walk = plan["estimate"]["phases"]["drafter"]
    assert part["walks"] == part["repairs"] * part["prompts"]
    assert plan["estimate"]["seconds"] + walk * part["repairs"] <= part["seconds"]
    assert part["seconds"] < part["seconds_up_to"]
    return part


def _repair(diagnosis, label_start):
    return next(r for r in diagnosis["repairs"]["tried"] if r["label"].startswith(label_start))


def test_a_drafter_trained_with_block_size_16_but_configured_for_8_is_repaired_by_it(lab, tmp_path):
    candidate = build_faulty_drafter(lab, "block-size")
    planned = plan_diagnose(lab, tmp_path / "plan", candidate)
    diagnosis = _diagnose(lab, tmp_path, candidate)
    # The dry run lists exactly the repairs the run tries, on its prompts.
    assert sorted(planned["labels"]) == sorted(r["label"] for r in diagnosis["repairs"]["tried"])
    assert planned["prompts"] >= diagnosis["repairs"]["prompts"]
    top = diagnosis["findings"][0]
    assert top["area"] == "repair", summary_lines(diagnosis)
    assert top["title"].startswith("block size 16")
    repair = _repair(diagnosis, "block size 16")
    assert repair["verdict"] == "finding" and repair["delta_tau"]["low"] > 0
    assert top["gap_closed"] == repair["gap_closed"] and top["repairs_tried"] > 5
    # The base is the run's own τ: the candidate's τ as eval reports it.
    assert diagnosis["repairs"]["tau_candidate"] == pytest.approx(
        diagnosis["candidate"]["metrics"]["tau_macro"]
    )
    written = json.loads((tmp_path / "diagnose.json").read_text())
    assert written["findings"][0]["title"] == top["title"]
    section = report_section(written)
    assert [row["slot"] for row in section["slots"]] == list(range(1, 8))
    assert section["findings"][0]["rank"] == 1
    assert section["repairs"][0]["repair"] == repair["label"]


def test_a_drafter_whose_fc_reads_one_layer_more_than_its_config_names_fails_first(lab, tmp_path):
    diagnosis = _diagnose(lab, tmp_path, build_faulty_drafter(lab, "fc-width"))
    first, second = diagnosis["findings"][:2]
    assert first["title"] == "fc reads 3 target layers, the config names 2"
    assert "[64, 192]" in first["evidence"] and "[1, 3]" in first["evidence"]
    assert second["area"] == "loading" and "fc.weight" in second["evidence"]


def test_a_config_that_turns_the_full_layers_causal_has_that_rule_measured_as_a_repair(
    lab, tmp_path
):
    """The lab's drafters hardly use the later (mask) slots of a block, so the rule moves their
    τ by less than noise here: the diagnosis must still try it and report the measurement
    beside the difference, never "not tried"."""
    diagnosis = _diagnose(lab, tmp_path, edited_drafter(lab, "attention-rule"))
    repair = _repair(diagnosis, "no layer causal (config: is_causal true)")
    assert repair["as_other"] is True and repair["tau"] is not None
    [difference] = [f for f in diagnosis["findings"] if f["title"].startswith("is_causal")]
    assert "its repair: τ " in difference["evidence"], difference
    assert "not tried" not in difference["evidence"]


def test_a_drafter_trained_on_soft_targets_is_repaired_by_nothing_and_found_flat(lab, tmp_path):
    diagnosis = _diagnose(lab, tmp_path, build_faulty_drafter(lab, "soft-target"))
    first = diagnosis["findings"][0]
    assert first["area"] == "calibration", summary_lines(diagnosis)
    assert "under-confident" in first["title"]
    assert all(r["verdict"] != "finding" for r in diagnosis["repairs"]["tried"])
    titles = [f["title"] for f in diagnosis["findings"]]
    assert any(t.startswith("no setting change closes the gap") for t in titles), titles
    mine, theirs = diagnosis["candidate"]["calibration"], diagnosis["other"]["calibration"]
    assert mine[0]["confidence"] < mine[0]["accuracy"]
    assert mine[0]["entropy"] > theirs[0]["entropy"]


def test_the_cli_writes_the_diagnosis_and_exits_zero(lab, tmp_path, capsys):
    out = tmp_path / "d.json"
    status = main(
        [
            "diagnose",
            "--checkpoint",
            str(build_faulty_drafter(lab, "fc-width")),
            "--target",
            str(lab.target_dir),
            "--reference-drafter",
            str(lab.checkpoints[6000]),
            "--prompts",
            str(lab.prompts),
            "--out",
            str(out),
            "--no-cache",
        ]
    )
    assert status == 0
    assert json.loads(out.read_text())["findings"][0]["rank"] == 1
    assert "fc reads 3 target layers" in capsys.readouterr().err


def test_diagnose_without_a_drafter_to_compare_with_says_so(lab, tmp_path, capsys):
    argv = ["diagnose", "--checkpoint", str(lab.checkpoints[2000]), "--target"]
    argv += [str(lab.target_dir), "--out", str(tmp_path / "d.json")]
    assert main(argv) == 2
    assert "--reference-drafter" in capsys.readouterr().err


def test_repairs_change_one_setting_at_a_time_within_the_target():
    rule = {"num_hidden_layers": 2, "layer_types": None, "is_causal": None}
    mine = SimpleNamespace(target_layer_ids=[1, 3], block_size=8, mask_token_id=3, **rule)
    other = SimpleNamespace(target_layer_ids=[2, 5], block_size=8, mask_token_id=7, **rule)
    repairs = repair_settings(mine, other, 6, vocab_size=100, special_tokens={"pad token": 0})
    layer_sets = [p["value"] for p in repairs if p["setting"] == "target_layer_ids"]
    assert [0, 3] in layer_sets and [1, 4] in layer_sets and [2, 4] in layer_sets
    assert [2, 5] in layer_sets  # the other drafter's
    # the loss layer (the target's last, 5) in place of the last id: an fc trained on it
    loss = next(p for p in repairs if p["label"].startswith("the loss layer"))
    assert loss["value"] == [1, 5] and loss["label"] == "the loss layer 5 as the last target layer"
    assert all(0 <= i < 6 for ids in layer_sets for i in ids)
    assert [1, 3] not in layer_sets  # the configured ids are the base, not a repair
    assert len(layer_sets) == len({tuple(ids) for ids in layer_sets})
    assert [p["value"] for p in repairs if p["setting"] == "block_size"] == [4, 16]
    masks = [p["value"] for p in repairs if p["setting"] == "mask_token_id"]
    assert masks == [7, 0]
    beyond = repair_settings(mine, other, 6, vocab_size=5, special_tokens={"pad token": 3})
    assert [p["value"] for p in beyond if p["setting"] == "mask_token_id"] == []
    # Full layers are not causal by default: only "every layer causal" changes anything.
    assert [p["value"] for p in repairs if p["setting"] == "is_causal"] == [True]


@pytest.mark.parametrize(
    ("layer_types", "is_causal", "tried"),
    [
        (["sliding_attention", "full_attention"], None, [True, False]),
        (["sliding_attention", "sliding_attention"], None, [False]),
        (None, True, [False]),
        (None, False, [True]),
    ],
)
def test_the_attention_rule_is_tried_both_ways_where_it_changes_a_layer(
    layer_types, is_causal, tried
):
    config = SimpleNamespace(
        target_layer_ids=[1],
        block_size=4,
        mask_token_id=0,
        num_hidden_layers=2,
        layer_types=layer_types,
        is_causal=is_causal,
    )
    settings = attention_settings(config)
    assert [p["value"] for p in settings] == tried
    assert all(p["label"].endswith(")") and "(config: " in p["label"] for p in settings)


@pytest.mark.parametrize(
    ("better", "base", "significant"),
    [([3.0, 3.2, 3.1], [2.0, 2.1, 2.0], True), ([3.0, 2.0, 3.1], [2.0, 3.1, 2.9], False)],
)
def test_a_paired_difference_counts_only_beyond_its_interval(better, base, significant):
    difference = paired_difference(better, base)
    assert (difference["mean"] - difference["half_width"] > 0) is significant


def test_one_prompt_is_never_evidence():
    assert math.isinf(paired_difference([5.0], [1.0])["half_width"])


def test_bf16_features_of_a_hybrid_target_on_cpu_are_named_first(lab, tmp_path):
    target = save_tiny_qwen3_5(tmp_path / "target", lab.target_dir, 101, False)
    config = small_config(target_layer_ids=(1, 2), mask_token_id=3)
    candidate = save_training_checkpoint(tmp_path / "c" / "checkpoint.pt", random_drafter(config))
    other = save_training_checkpoint(tmp_path / "o" / "checkpoint.pt", random_drafter(config, 1))
    options = diagnose_options(
        lab, tmp_path, candidate, other, max_new_tokens=10, target=target, target_dtype="bfloat16"
    )
    diagnosis = run_diagnose(DiagnoseOptions(options, "other"), Progress(quiet=True))
    top = diagnosis["findings"][0]
    assert top["area"] == "features", summary_lines(diagnosis)
    assert top["title"] == "bfloat16 features of a linear-attention target on CPU"
    # ... and float32 features are tried as a repair, measured like any other
    label = "target features in float32 (the run's: bfloat16)"
    [tried] = [r for r in diagnosis["repairs"]["tried"] if r["setting"] == "features_dtype"]
    assert tried["label"] == label and tried["delta_tau"]["low"] is not None
    assert diagnosis["repairs"]["not_tried"] == []
    stored = {_stored_dtype(path) for path in (tmp_path / "cache" / "hidden").iterdir()}
    assert stored == {"torch.bfloat16", "torch.float32"}  # the repair read float32 ones
    # the dry run plans it, or says why not where float32 weights do not fit
    roomy = make_diagnose_plan(options, plan_facts())["diagnose"]
    assert label in roomy["labels"] and roomy["not_tried"] == []
    tight = make_diagnose_plan(options, plan_facts(available_kb=1))["diagnose"]
    assert label not in tight["labels"]
    [skipped] = tight["not_tried"]
    assert skipped["label"] == label and "this host has 0.0 GiB available" in skipped["why"]
    assert roomy["seconds"] > tight["seconds"]


def _stored_dtype(entry) -> str:
    with safe_open(str(entry), "pt") as stored:
        return json.loads(stored.metadata()["key"])["target_dtype"]


def test_float32_features_are_a_repair_only_where_the_runs_drift_with_their_dtype():
    assert dtype_settings("float32", drifts=True) == []
    assert dtype_settings("bfloat16", drifts=False) == []  # a plain Qwen3's are the same
    [setting] = dtype_settings("bfloat16", drifts=True)
    assert setting == {
        "setting": "features_dtype",
        "label": "target features in float32 (the run's: bfloat16)",
        "value": "float32",
    }


def test_float32_weights_fit_with_their_margin_or_the_shortfall_says_how_much():
    gib = 2**30
    assert float32_shortfall("bfloat16", 10 * gib, 23 * gib) is None  # 10 × 2 × 1.1 = 22
    assert float32_shortfall("bfloat16", 10 * gib, 21 * gib) == (
        "float32 weights need about 22.0 GiB; this host has 21.0 GiB available"
    )
    assert "this host has unknown available" in float32_shortfall("float32", gib, None)


def test_a_candidate_with_nan_weights_is_named_so_not_as_a_strict_load_failure(lab, tmp_path):
    drafter = random_drafter(small_config())
    state = {name: tensor.clone() for name, tensor in drafter.state_dict().items()}
    state["norm.weight"][0] = float("nan")
    candidate = save_training_checkpoint(
        tmp_path / "c" / "checkpoint.pt", drafter, state_dict=state
    )
    diagnosis = _diagnose(lab, tmp_path, candidate)
    first = diagnosis["findings"][0]
    assert first["title"] == "the candidate's weights hold NaN or inf", summary_lines(diagnosis)
    assert "norm.weight" in first["evidence"] and "non-finite" in first["evidence"]


def test_an_earlier_step_of_the_same_run_is_called_less_trained_with_no_setting_claim(
    lab, tmp_path
):
    diagnosis = _diagnose(lab, tmp_path, lab.checkpoints[2000])
    first = diagnosis["findings"][0]
    assert first["area"] == "training", summary_lines(diagnosis)
    assert first["title"].startswith("less trained: step 2000 is an earlier step of a run")
    gap = diagnosis["gap"]
    assert gap["mean"] - gap["half_width"] > 0.5  # the lab's 2000 is far behind its 6000
    claims = [f for f in diagnosis["findings"] if f.get("setting") or f["area"] == "configuration"]
    assert claims == [], summary_lines(diagnosis)
    # at its floor (τ 1.03) the share of the gap in the features would only restate the gap
    assert diagnosis["repairs"]["tau_candidate"] < 1.05
    assert not [f for f in diagnosis["findings"] if f["area"] == "features"]
