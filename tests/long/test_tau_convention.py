"""τ as z-lab's benchmark and the DDTree authors' loop report it, against plain live loops.

The live loops (live_loops.py) run past max_new_tokens like z-lab's `dflash_generate`: the
last round is not capped, the round anchored at the last completion token runs, and the
loop ends after the round that commits a stop token. The harness walks a reference
completion offline; its vanilla and per-budget DDTree τ must equal theirs exactly.
"""

from __future__ import annotations

import json

import pytest
import torch
from dflash_eval.contract.prompts import read_prompts_jsonl
from dflash_eval.drafter.loaders import load_drafter
from dflash_eval.reference.cache import key_digest
from dflash_eval.reference.completions import greedy_reference
from dflash_eval.reference.conversation import encode_prompt
from dflash_eval.reference.sequence import first_stop
from dflash_eval.target.files import load_tokenizer, stop_token_ids
from dflash_eval.target.model import load_target
from dflash_eval.walk.metrics import Span, walk_prompt
from dflash_eval.walk.predict import BorrowedHead, Predictor
from transformers import AutoModelForCausalLM

from tests.unit.harness.helpers import quick_eval, save_tiny_qwen3_5
from tests.unit.harness.live_loops import LiveModels, LiveRun, PlainDrafter

pytestmark = pytest.mark.long(65)  # seconds in a cold `make test` (5 workers)

MAX_NEW_TOKENS = 37  # not a multiple of the block size: the last round runs past it
BUDGETS = [4, 8, 32]


@pytest.fixture(scope="module")
def live(lab):
    def models(step: int) -> LiveModels:
        model = AutoModelForCausalLM.from_pretrained(str(lab.target_dir), dtype=torch.float32)
        target = load_target(lab.target_dir, "float32")
        drafter = load_drafter(lab.checkpoints[step], target.shape).model
        return LiveModels(
            model.eval(),
            PlainDrafter(drafter.config.to_hf_dict(), drafter.state_dict()),
            model.model.embed_tokens.weight.detach(),
            model.lm_head.weight.detach(),
        )

    return models


def _lab_prompt_ids(lab, count: int) -> list[list[int]]:
    tokenizer = load_tokenizer(lab.target_dir)
    return [encode_prompt(tokenizer, p)[0] for p in read_prompts_jsonl(lab.prompts)[:count]]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.parametrize("step", [4000, 6000])
def test_vanilla_and_ddtree_tau_equal_live_loops_that_run_past_max_new_tokens(
    lab, tmp_path, live, step
):
    models = live(step)
    stops = stop_token_ids(lab.target_dir, load_tokenizer(lab.target_dir))
    results = quick_eval(
        lab,
        tmp_path,
        checkpoint=lab.checkpoints[step],
        max_new_tokens=MAX_NEW_TOKENS,
        ddtree=BUDGETS,
    )
    metrics = results["metrics"]
    assert metrics["tau_convention"] == "zlab-live-loop"
    prompts = _lab_prompt_ids(lab, 3)
    for budget in [None, *BUDGETS]:
        runs = [LiveRun(models, ids, MAX_NEW_TOKENS, stops, budget).old_loop() for ids in prompts]
        lengths = [run[1] for run in runs]
        per_prompt = [_mean(x) for x in lengths]
        pooled = sum(map(sum, lengths)) / sum(map(len, lengths))
        block = metrics if budget is None else metrics["ddtree"][str(budget)]
        assert block["tau_macro"] == pytest.approx(_mean(per_prompt), rel=1e-12), budget
        assert block["tau_pooled"] == pytest.approx(pooled, rel=1e-12), budget
        assert block["rounds"] == sum(map(len, lengths))
        if budget is None:
            assert [row["tau"] for row in results["per_prompt"]] == pytest.approx(per_prompt)
            # Some last round went past max_new_tokens: the case the convention is about.
            assert any(sum(x) > MAX_NEW_TOKENS - 1 for x in lengths)
        # z-lab's current loop (07ebd93): the last block shortened, its count capped.
        runs = [
            LiveRun(models, ids, MAX_NEW_TOKENS, stops, budget).current_loop() for ids in prompts
        ]
        lengths = [run[1] for run in runs]
        capped = metrics["capped"] if budget is None else metrics["capped"]["ddtree"][str(budget)]
        assert capped["tau_macro"] == pytest.approx(_mean([_mean(x) for x in lengths]), rel=1e-12)
        assert capped["rounds"] == sum(map(len, lengths)), budget
    assert metrics["incomplete_references"] == 0
    assert metrics["capped"]["committed_tokens"] == 3 * (MAX_NEW_TOKENS - 1)
    assert metrics["capped"]["tau_convention"] == "zlab-07ebd93"


def _offline(lab, models: LiveModels, prompt_ids, stops, budgets, max_rounds=None):
    """The harness's pieces by hand, with a chosen set of stop tokens."""
    target = load_target(lab.target_dir, "float32")
    drafter = load_drafter(lab.checkpoints[6000], target.shape).model
    config = drafter.config
    reference = greedy_reference(target.model, prompt_ids, MAX_NEW_TOKENS, config.block_size, stops)
    tokens = prompt_ids + reference
    first, stop = len(prompt_ids), first_stop(reference, stops)
    span = Span(first, first + MAX_NEW_TOKENS, None if stop is None else first + stop)
    hidden = target.hidden_features(tokens, list(config.target_layer_ids))
    features = torch.cat([hidden[i] for i in config.target_layer_ids], dim=-1)
    head = BorrowedHead(models.embed, models.head, config.mask_token_id)
    predictor = Predictor(drafter, head, tokens, features, first, config.block_size, max(budgets))
    walked = walk_prompt(predictor, tokens, span, config.block_size, budgets, max_rounds)
    return reference, span, walked


def test_a_stop_token_ends_the_walk_after_the_round_that_commits_it(lab, live):
    models = live(6000)
    block_size = models.drafter.block_size
    prompt_ids = _lab_prompt_ids(lab, 1)[0]
    plain = greedy_reference(models.target, prompt_ids, MAX_NEW_TOKENS, 0, [])
    checked = 0
    # The lab target never emits its EOS; stand in for it with tokens it does emit.
    for stop_at in (0, 9, 20, MAX_NEW_TOKENS - 1):
        stops = [plain[stop_at]]
        reference, span, walked = _offline(lab, models, prompt_ids, stops, [8])
        stop = plain.index(stops[0])  # its first occurrence
        assert span.stop == len(prompt_ids) + stop
        assert reference == plain[: stop + 1] + reference[stop + 1 :]
        assert len(reference) == min(MAX_NEW_TOKENS, stop + 1) + block_size
        for budget in (None, 8):
            tokens, lengths = LiveRun(models, prompt_ids, MAX_NEW_TOKENS, stops, budget).old_loop()
            offline = walked.lengths if budget is None else walked.ddtree_lengths[8]
            assert offline == lengths, (stop_at, budget)
            assert tokens[: stop + 1] == reference[: stop + 1]
            current = walked.capped_lengths if budget is None else walked.capped_ddtree_lengths[8]
            assert (
                current
                == LiveRun(models, prompt_ids, MAX_NEW_TOKENS, stops, budget).current_loop()[1]
            )
            # The last round committed the stop token, and may have gone past it.
            assert sum(lengths) >= stop and sum(lengths[:-1]) < max(stop, 1)
        checked += stop > 0
    assert checked >= 2


def test_max_rounds_gives_exactly_the_first_rounds(lab, live):
    models = live(6000)
    prompt_ids = _lab_prompt_ids(lab, 1)[0]
    _, _, full = _offline(lab, models, prompt_ids, [], [4, 8])
    rounds = len(full.lengths)
    for max_rounds in (1, 2, rounds - 1, rounds, rounds + 1):
        _, _, cut = _offline(lab, models, prompt_ids, [], [4, 8], max_rounds)
        assert cut.lengths == full.lengths[:max_rounds]
        assert len(cut.slot_correct) == len(cut.anchors) == min(max_rounds, rounds)
        for budget in (4, 8):
            expected = full.ddtree_lengths[budget][:max_rounds]
            assert cut.ddtree_lengths[budget] == expected


def test_max_blocks_and_per_position_rows_in_the_results(lab, tmp_path):
    results = quick_eval(lab, tmp_path, max_blocks=5)
    assert [row["rounds"] for row in results["per_prompt"]] == [5, 5, 5]
    metrics = results["metrics"]
    assert metrics["rounds"] == 15 and metrics["capped"]["rounds"] == 15
    assert all(tree["rounds"] == 15 for tree in metrics["ddtree"].values())
    full = quick_eval(lab, tmp_path)["metrics"]
    block_size = full["block_size"]
    rows = full["per_position"]
    # One row per draft slot, no more, no fewer; every round checks every slot, the last
    # one included (the reference runs a block past the completion).
    assert [row["position"] for row in rows] == list(range(1, block_size))
    assert all(row["rounds"] == full["rounds"] for row in rows)
    assert [row["id"] for row in results["per_prompt"]] == ["lab-0", "lab-1", "lab-2"]
    assert sum(full["histogram"].values()) == full["rounds"]
    assert set(full["histogram"]) == {str(n) for n in range(1, block_size + 1)}


def test_completions_cut_at_the_end_are_not_reused_from_the_cache(lab, tmp_path):
    first = quick_eval(lab, tmp_path, num_prompts=2, ddtree=[])
    rows = first["per_prompt"]
    assert [row["reference_tokens"] for row in rows] == [48 + 8, 48 + 8]
    # Rewrite each cached entry as the previous harness wrote it: cut at max_new_tokens,
    # under a key without the extra tokens.
    for path in (tmp_path / "cache" / "completions").glob("*.json"):
        entry = json.loads(path.read_text())
        old_key = {k: v for k, v in entry["key"].items() if k != "extra_tokens"}
        old = {"key": old_key, "output_ids": entry["output_ids"][:48]}
        (path.parent / f"{key_digest(old_key)}.json").write_text(json.dumps(old))
        path.unlink()
    again = quick_eval(lab, tmp_path, num_prompts=2, ddtree=[])
    assert [row["cache"]["completion"] for row in again["per_prompt"]] == [False, False]
    assert again["metrics"] == first["metrics"]


@pytest.mark.parametrize("wrapper", [False, True], ids=["qwen3_5-text", "qwen3_5-vl-wrapper"])
def test_greedy_reference_equals_generate_on_other_target_families(lab, tmp_path, wrapper):
    target_dir = save_tiny_qwen3_5(tmp_path / "target", lab.target_dir, 101, wrapper)
    target = load_target(target_dir, "float32")
    prompt_ids = _lab_prompt_ids(lab, 1)[0]
    generated = target.greedy(prompt_ids, 24, [])
    reference = greedy_reference(target.model, prompt_ids, 16, 8, [])
    assert reference == generated[: len(reference)] and len(reference) == 24
