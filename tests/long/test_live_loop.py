"""The harness against plain live loops (live_loops.py), on drafters built with each feature
of z-lab's current `dflash/model.py` (07ebd93): causal sliding windows narrower than the
context, `is_causal: false` on sliding layers, `is_causal: true` on full layers, and the
embedding and logit fields. T=0, float32.

Each drafter is the lab's trained one (its weights) under a changed config.json, loaded by
the harness from a Hugging Face directory. The live loops draft with `PlainDrafter`, which
shares no code with the harness; the harness's batched, per-block and uncached paths must
give the same rounds, in both loop conventions, and the same logits.
"""

from __future__ import annotations

import json

import pytest
import torch
from dflash_eval.contract.prompts import read_prompts_jsonl
from dflash_eval.drafter.loaders import load_drafter
from dflash_eval.reference.completions import greedy_reference
from dflash_eval.reference.conversation import encode_prompt
from dflash_eval.target.files import load_tokenizer
from dflash_eval.target.model import load_target
from dflash_eval.walk.metrics import Span, walk_prompt
from dflash_eval.walk.predict import BorrowedHead, PerBlockPredictor, Predictor
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from tests.unit.harness.helpers import quick_eval
from tests.unit.harness.live_loops import LiveModels, LiveRun, PlainDrafter, draft_logits

pytestmark = pytest.mark.long(40)  # seconds in a cold `make test` (5 workers)

MAX_NEW_TOKENS = 29  # not a multiple of the block size (8): the last block is shortened
WINDOW = 5  # narrower than every context here (prompts of 16 tokens and more)
FEATURES = {
    "as-trained": {},  # full, non-causal layers
    "causal-sliding": {
        "layer_types": ["sliding_attention", "full_attention"],
        "use_sliding_window": True,
        "sliding_window": WINDOW,
    },
    "not-causal-sliding": {  # the window (5 < B) also hides slots far ahead
        "layer_types": ["sliding_attention", "full_attention"],
        "use_sliding_window": True,
        "sliding_window": WINDOW,
        "is_causal": False,
    },
    "causal-full": {"is_causal": True},
    "fields": {
        "input_embedding_scale": 1.5,
        "dflash_config": {"output_multiplier": 0.7, "final_logit_softcapping": 3.0},
    },
}


@pytest.fixture(scope="module")
def lab_parts(lab):
    model = AutoModelForCausalLM.from_pretrained(str(lab.target_dir), dtype=torch.float32)
    target = load_target(lab.target_dir, "float32")
    trained = load_drafter(lab.checkpoints[6000], target.shape).model
    tokenizer = load_tokenizer(lab.target_dir)
    prompts = [encode_prompt(tokenizer, p)[0] for p in read_prompts_jsonl(lab.prompts)[:2]]
    return model.eval(), target, trained, prompts


def feature_drafter(directory, trained, changes: dict) -> tuple[dict, object]:
    """The trained weights under the trained config with `changes`, as an HF directory."""
    config = trained.config.to_hf_dict()
    nested = {**config["dflash_config"], **changes.get("dflash_config", {})}
    config = {**config, **changes, "dflash_config": nested}
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    save_file(
        {k: v.contiguous() for k, v in trained.state_dict().items()},
        directory / "model.safetensors",
    )
    return config, directory


@pytest.fixture(scope="module", params=list(FEATURES))
def feature(request, lab_parts, tmp_path_factory):
    model, target, trained, _ = lab_parts
    directory = tmp_path_factory.mktemp("drafters") / request.param
    config, directory = feature_drafter(directory, trained, FEATURES[request.param])
    loaded = load_drafter(directory, target.shape)
    embed, head = model.model.embed_tokens.weight.detach(), model.lm_head.weight.detach()
    live = LiveModels(model, PlainDrafter(config, trained.state_dict()), embed, head)
    return request.param, directory, loaded.model, live


def _walks(target, drafter, live: LiveModels, prompt_ids, budgets):
    block_size = drafter.config.block_size
    reference = greedy_reference(target.model, prompt_ids, MAX_NEW_TOKENS, block_size, [])
    tokens = prompt_ids + reference
    first = len(prompt_ids)
    hidden = target.hidden_features(tokens, list(drafter.config.target_layer_ids))
    features = torch.cat([hidden[i] for i in drafter.config.target_layer_ids], dim=-1)
    head = BorrowedHead(live.embed, live.head, drafter.config.mask_token_id)
    span = Span(first, first + MAX_NEW_TOKENS)
    walks = []
    for kind in (Predictor, PerBlockPredictor):  # batched chunks, and one block per pass
        predictor = kind(drafter, head, tokens, features, first, block_size, max(budgets))
        walks.append(walk_prompt(predictor, tokens, span, block_size, budgets))
    return walks


def test_rounds_equal_the_plain_live_loops_in_both_conventions(lab_parts, feature):
    _, target, _, prompts = lab_parts
    name, _, drafter, live = feature
    accepted = 0
    for prompt_ids in prompts:
        batched, per_block = _walks(target, drafter, live, prompt_ids, [4])
        assert batched == per_block
        for budget, default, current in (
            (None, batched.lengths, batched.capped_lengths),
            (4, batched.ddtree_lengths[4], batched.capped_ddtree_lengths[4]),
        ):
            assert default == LiveRun(live, prompt_ids, MAX_NEW_TOKENS, [], budget).old_loop()[1]
            assert (
                current == LiveRun(live, prompt_ids, MAX_NEW_TOKENS, [], budget).current_loop()[1]
            )
        accepted += sum(length > 1 for length in batched.lengths)
        assert sum(batched.capped_lengths) == MAX_NEW_TOKENS - 1
    assert accepted > 0, f"{name}: no draft accepted, the rounds would prove little"


def test_logits_equal_the_plain_drafters_on_every_path(lab_parts, feature):
    _, target, trained, prompts = lab_parts
    name, _, drafter, live = feature
    config = drafter.config
    tokens = prompts[0] + target.greedy(prompts[0], 24, [])
    hidden = target.hidden_features(tokens, list(config.target_layer_ids))
    features = torch.cat([hidden[i] for i in config.target_layer_ids], dim=-1)
    anchors = [len(prompts[0]) + k for k in (0, 3, 7, 12)]
    cache = drafter.context_cache(drafter.fuse_context(features[: max(anchors)]))
    with torch.no_grad():
        for size in (config.block_size, 3):  # a whole block, and a shortened last one
            ids = torch.full((len(anchors), size), config.mask_token_id)
            ids[:, 0] = torch.tensor(tokens)[anchors]
            embeds = drafter.embed_block(live.embed, ids)
            batched = drafter.forward_blocks(embeds, torch.tensor(anchors), cache)
            batched = drafter.logits(batched[:, 1:], live.head)
            for row, anchor in enumerate(anchors):
                plain = draft_logits(live, tokens, anchor, size)
                single = drafter.forward_blocks(
                    embeds[row : row + 1], torch.tensor([anchor]), cache
                )
                uncached = drafter.forward_uncached(
                    drafter.fuse_context(features[:anchor]), embeds[row]
                )
                for ours in (
                    batched[row],
                    drafter.logits(single[0, 1:], live.head),
                    drafter.logits(uncached[1:], live.head),
                ):
                    torch.testing.assert_close(ours, plain, atol=1e-4, rtol=1e-4)
    if name != "as-trained":  # the feature changes the maths: a no-op would prove nothing
        as_trained = PlainDrafter(trained.config.to_hf_dict(), trained.state_dict())
        plain_trained = as_trained.logits(
            features[: anchors[1]],
            [tokens[anchors[1]]] + [config.mask_token_id] * 7,
            live.embed,
            live.head,
        )
        assert not torch.allclose(plain_trained, draft_logits(live, tokens, anchors[1]), atol=1e-3)


def test_the_results_record_each_layers_attention_and_both_conventions(lab, lab_parts, tmp_path):
    model, _, trained, prompts = lab_parts
    config, directory = feature_drafter(tmp_path / "drafter", trained, FEATURES["causal-sliding"])
    results = quick_eval(
        lab, tmp_path, checkpoint=directory, num_prompts=2, max_new_tokens=MAX_NEW_TOKENS, ddtree=[]
    )
    assert results["drafter"]["attention"] == [
        {"kind": "sliding_attention", "causal": True, "window": WINDOW},
        {"kind": "full_attention", "causal": False, "window": None},
    ]
    assert results["schema_version"] == 3
    metrics = results["metrics"]
    assert metrics["tau_convention"] == "zlab-live-loop"
    assert metrics["capped"]["tau_convention"] == "zlab-07ebd93"
    assert "7d2ea1e9828b" in metrics["conventions"]["zlab-live-loop"]
    assert "07ebd93db9f4" in metrics["conventions"]["zlab-07ebd93"]
    embed, head = model.model.embed_tokens.weight.detach(), model.lm_head.weight.detach()
    live = LiveModels(model, PlainDrafter(config, trained.state_dict()), embed, head)
    for row, prompt_ids in zip(results["per_prompt"], prompts, strict=True):
        lengths = LiveRun(live, prompt_ids, MAX_NEW_TOKENS, []).current_loop()[1]
        assert row["tau_capped"] == pytest.approx(sum(lengths) / len(lengths), rel=1e-12)
