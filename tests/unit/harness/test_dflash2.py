"""DFlash-2 drafters (docs/dflash2.md): loading both forms strictly, and the harness's τ at T=0
against a plain live loop with a plain DFlash-2 forward (live_dflash2.py), round for round,
in both of z-lab's loop conventions, with full non-causal layers and with causal sliding
layers and the logit fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.prompts import read_prompts_jsonl
from dflash_eval.contract.schema_check import parse_results
from dflash_eval.drafter.loaders import load_drafter
from dflash_eval.drafter.model_dflash2 import DFlash2Drafter
from dflash_eval.drafter.profile import read_profile
from dflash_eval.reference.completions import greedy_reference
from dflash_eval.reference.conversation import encode_prompt
from dflash_eval.run.extract import extract
from dflash_eval.target.files import load_tokenizer, stop_token_ids
from dflash_eval.target.model import load_target
from dflash_eval.walk.metrics import PromptWalk, Span, walk_prompt
from dflash_eval.walk.predict import BorrowedHead, PerBlockPredictor, Predictor
from transformers import AutoModelForCausalLM

from .dflash2_drafter import build_dflash2_files, hf_names, save_hf_dir
from .helpers import quick_eval
from .live_dflash2 import PlainDFlash2
from .live_loops import LiveModels, LiveRun, context_features

MAX_NEW_TOKENS = 37  # not a multiple of the block size: the last round runs past it
WINDOW = 6  # a sliding window narrower than every context
PROMPTS = 3


@pytest.fixture(scope="module")
def files(lab, tmp_path_factory):
    target = load_target(lab.target_dir, "float32")
    root = tmp_path_factory.mktemp("dflash2")
    return build_dflash2_files(lab.checkpoints[6000], target.shape.vocab_size, root)


@pytest.fixture(scope="module")
def target(lab):
    return load_target(lab.target_dir, "float32")


@pytest.fixture(scope="module")
def live(lab, files):
    model = AutoModelForCausalLM.from_pretrained(str(lab.target_dir), dtype=torch.float32)
    return LiveModels(
        model.eval(),
        PlainDFlash2(files.config, files.weights),
        model.model.embed_tokens.weight.detach(),
        model.lm_head.weight.detach(),
    )


def _prompt_ids(lab) -> list[list[int]]:
    tokenizer = load_tokenizer(lab.target_dir)
    return [encode_prompt(tokenizer, p)[0] for p in read_prompts_jsonl(lab.prompts)[:PROMPTS]]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_hf_directory_and_training_checkpoint_with_profile_load_the_same_drafter(
    files, target, tmp_path
):
    from_hf = load_drafter(files.hf_dir, target.shape)
    from_training = load_drafter(
        files.checkpoint, target.shape, profile=read_profile(files.profile)
    )
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(files.config))
    extract(files.checkpoint, tmp_path / "extracted", config_file=config_file)
    from_extracted = load_drafter(tmp_path / "extracted", target.shape)
    for loaded in (from_hf, from_training, from_extracted):
        assert isinstance(loaded.model, DFlash2Drafter)
        state = loaded.model.state_dict()
        assert state.keys() == files.weights.keys()
        assert all(torch.equal(state[name], files.weights[name]) for name in state)
        assert loaded.config.dflash2.selector_top_k == 4
    assert from_hf.source.renamed_parameters == 2  # the reference's two codebook renames
    assert from_training.source.renamed_parameters == 0  # already the module names
    assert from_training.config_source == "profile dflash2-lab config"


@dataclass
class Offline:
    """The harness's pieces by hand for one prompt: its reference tokens and features, the
    drafter, a predictor over them and its walk."""

    tokens: list[int]
    features: torch.Tensor
    drafter: DFlash2Drafter
    predictor: Predictor
    walked: PromptWalk

    def block_embeds(self, anchors: list[int], embed: torch.Tensor) -> torch.Tensor:
        config = self.drafter.config
        blocks = torch.full((len(anchors), config.block_size), config.mask_token_id)
        blocks[:, 0] = torch.tensor(self.tokens)[anchors]
        return embed[blocks]


def _offline(directory, target, live, prompt_ids, stops, **predictor) -> Offline:
    loaded = load_drafter(directory, target.shape)
    config = loaded.config
    reference = greedy_reference(target.model, prompt_ids, MAX_NEW_TOKENS, config.block_size, stops)
    tokens = prompt_ids + reference
    hidden = target.hidden_features(tokens, list(config.target_layer_ids))
    features = torch.cat([hidden[i] for i in config.target_layer_ids], dim=-1)
    head = BorrowedHead(live.embed, live.head, config.mask_token_id)
    predictor_class = predictor.pop("predictor_class", Predictor)
    first = len(prompt_ids)
    made = predictor_class(
        loaded.model, head, tokens, features, first, config.block_size, 1, **predictor
    )
    span = Span(first, first + MAX_NEW_TOKENS)
    walked = walk_prompt(made, tokens, span, config.block_size)
    return Offline(tokens, features, loaded.model, made, walked)


def test_dflash2_rounds_and_logits_equal_a_plain_live_loop(lab, files, target, live):
    stops = stop_token_ids(lab.target_dir, load_tokenizer(lab.target_dir))
    overridden = accepted = 0
    for prompt_ids in _prompt_ids(lab):
        run = LiveRun(live, prompt_ids, MAX_NEW_TOKENS, stops)
        live_tokens, live_rounds = run.old_loop()
        offline = _offline(files.hf_dir, target, live, prompt_ids, stops)
        tokens, walked = offline.tokens, offline.walked
        assert tokens[len(prompt_ids) :][: len(live_tokens)] == live_tokens
        assert walked.lengths == live_rounds
        # 07ebd93's loop: the last block shortened, through the harness's forward_blocks.
        assert walked.capped_lengths == run.current_loop()[1]
        # Logits of every live round's block: the plain single-block forward against the
        # harness's batched pass over all of those blocks at once.
        drafter, anchors = offline.drafter, walked.anchors
        with torch.no_grad():
            cache = drafter.context_cache(drafter.fuse_context(offline.features[: max(anchors)]))
            batched = drafter.forward_blocks(
                offline.block_embeds(anchors, live.embed), torch.tensor(anchors), cache
            )
        for row, anchor in enumerate(anchors):
            features = context_features(live, tokens, anchor)
            logits, path = live.drafter.draft(features, tokens[anchor], live.embed, live.head)
            torch.testing.assert_close(batched[row, 1:] @ live.head.T, logits, rtol=1e-4, atol=1e-4)
            assert offline.predictor.draft(anchor) == path
            overridden += path != logits.argmax(-1).tolist()
        accepted += max(live_rounds) > 1
    assert overridden, "the selector should override the per-slot argmax somewhere"
    assert accepted, "some round should accept drafts"


def _sliding_with_logit_fields(config: dict) -> dict:
    """The config as z-lab's current code can state it: every layer sliding (causal, as
    is_causal is absent) with a window narrower than the context, and both logit fields."""
    changed = json.loads(json.dumps(config))
    layers = changed["num_hidden_layers"]
    changed.update(
        layer_types=["sliding_attention"] * layers,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=layers,
    )
    changed["dflash_config"].update(output_multiplier=0.5, final_logit_softcapping=4.0)
    return changed


def test_a_causal_sliding_dflash2_drafter_with_logit_fields_equals_the_live_loop(
    lab, files, target, live, tmp_path
):
    config = _sliding_with_logit_fields(files.config)
    directory = save_hf_dir(tmp_path / "sliding", config, hf_names(files.weights))
    plain = PlainDFlash2(config, files.weights)
    sliding = LiveModels(live.target, plain, live.embed, live.head)
    stops = stop_token_ids(lab.target_dir, load_tokenizer(lab.target_dir))
    prompt_ids = _prompt_ids(lab)[0]
    run = LiveRun(sliding, prompt_ids, MAX_NEW_TOKENS, stops)
    offline = _offline(directory, target, live, prompt_ids, stops)
    assert offline.drafter.config.layer_attention(0).causal
    assert offline.walked.lengths == run.old_loop()[1]
    assert offline.walked.capped_lengths == run.current_loop()[1]
    # The selector reads transformed logits: without the fields some draft would differ.
    unscaled = PlainDFlash2(
        {**config, "dflash_config": files.config["dflash_config"]}, files.weights
    )
    tokens, changed = offline.tokens, 0
    for anchor in offline.walked.anchors:
        features = context_features(sliding, tokens, anchor)
        _, path = plain.draft(features, tokens[anchor], live.embed, live.head)
        assert offline.predictor.draft(anchor) == path
        changed += path != unscaled.draft(features, tokens[anchor], live.embed, live.head)[1]
    assert changed, "output_multiplier and the softcap should change some selector choice"


def test_batched_chunks_equal_one_block_at_a_time(lab, files, target, live):
    prompt_ids = _prompt_ids(lab)[0]
    batched = _offline(files.hf_dir, target, live, prompt_ids, [], chunk=7)
    single = _offline(files.hf_dir, target, live, prompt_ids, [], predictor_class=PerBlockPredictor)
    anchors = range(len(prompt_ids), len(prompt_ids) + MAX_NEW_TOKENS)
    drafts = [batched.predictor.draft(a) for a in anchors]
    assert drafts == [single.predictor.draft(a) for a in anchors]
    # The context cache against the context recomputed in every layer, for one block.
    drafter, anchor = batched.drafter, anchors[5]
    block = batched.block_embeds([anchor], live.embed)
    ctx = drafter.fuse_context(batched.features[:anchor])
    with torch.no_grad():
        cached = drafter.forward_blocks(block, torch.tensor([anchor]), drafter.context_cache(ctx))
        uncached = drafter.forward_uncached(ctx, block[0])
    torch.testing.assert_close(cached[0], uncached, rtol=1e-5, atol=1e-5)


def test_run_eval_reports_dflash2_metrics_as_the_live_loop(lab, files, live, tmp_path):
    results = quick_eval(
        lab, tmp_path, checkpoint=files.hf_dir, max_new_tokens=MAX_NEW_TOKENS, ddtree=None
    )
    stops = stop_token_ids(lab.target_dir, load_tokenizer(lab.target_dir))
    runs = [LiveRun(live, ids, MAX_NEW_TOKENS, stops) for ids in _prompt_ids(lab)]
    rounds = [run.old_loop()[1] for run in runs]
    metrics = results["metrics"]
    written = json.loads((tmp_path / "r.json").read_text())
    assert parse_results(written)["drafter"]["architecture"] == "DFlash2DraftModel"
    assert results["drafter"]["config"]["dflash_config"]["selector_top_k"] == 4
    assert metrics["tau_macro"] == pytest.approx(_mean([_mean(r) for r in rounds]), rel=1e-12)
    assert metrics["tau_pooled"] == pytest.approx(sum(map(sum, rounds)) / sum(map(len, rounds)))
    capped = [run.current_loop()[1] for run in runs]
    assert metrics["capped"]["tau_macro"] == pytest.approx(_mean([_mean(c) for c in capped]))
    first_slot = metrics["per_position"][0]
    hits = sum(r > 1 for walk in rounds for r in walk)
    assert first_slot["unconditional"] == pytest.approx(hits / sum(map(len, rounds)))
    assert metrics["ddtree"] == {} and results["options"]["ddtree"] == []


def test_ddtree_over_a_dflash2_drafter_is_refused_in_one_line(lab, files, tmp_path):
    with pytest.raises(HarnessError) as refused:
        quick_eval(lab, tmp_path, checkpoint=files.hf_dir, ddtree=[4, 8])
    assert "DFlash-2" in str(refused.value) and "--ddtree" in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("role", ["drafter", "reference drafter"])
def test_sampling_with_a_dflash2_drafter_is_refused_in_one_line(lab, files, tmp_path, role):
    drafters = (
        {"checkpoint": files.hf_dir}
        if role == "drafter"
        else {"reference_drafter": files.hf_dir}  # the plain lab drafter evaluates
    )
    with pytest.raises(HarnessError) as refused:
        quick_eval(lab, tmp_path, **drafters, temperature=0.7, ddtree=None)
    message = str(refused.value)
    assert message.startswith("--temperature 0.7: ") and str(files.hf_dir) in message
    assert "DFlash-2" in message and "--temperature 0" in message and "\n" not in message
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("missing", "missing (1): layers.1.mlp_conv.kernel_projection.weight"),
        ("extra", "unexpected (1): layers.0.attention_conv.extra_kernel"),
        ("misshaped", "candidate_selector.successor_codebook.weight (expected [{V}, 8], found"),
    ],
)
def test_strict_loading_names_a_bad_dflash2_parameter(files, target, tmp_path, change, expected):
    vocab = target.shape.vocab_size
    stored = hf_names(files.weights)
    if change == "missing":
        del stored["layers.1.mlp_conv.kernel_projection.weight"]
    elif change == "extra":
        stored["layers.0.attention_conv.extra_kernel"] = torch.zeros(3)
    else:
        stored["candidate_selector.successor_codebook"] = torch.zeros(vocab, 9)
    directory = save_hf_dir(tmp_path / change, files.config, stored)
    with pytest.raises(HarnessError) as refused:
        load_drafter(directory, target.shape)
    assert expected.format(V=vocab) in str(refused.value)


def _plain(config: dict) -> dict:
    """The config with its DFlash-2 parts taken out: a plain DFlash config."""
    plain = json.loads(json.dumps(config))
    del plain["architectures"]
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        del plain["dflash_config"][key]
    return plain


def test_a_plain_config_over_dflash2_weights_says_it_needs_the_dflash2_config(
    files, target, tmp_path
):
    directory = save_hf_dir(tmp_path / "plain", _plain(files.config), hf_names(files.weights))
    with pytest.raises(HarnessError, match=r"DFlash-2 parts .* needs its DFlash-2 config"):
        load_drafter(directory, target.shape)


def test_a_plain_config_file_against_the_profiles_dflash2_config_is_refused(
    files, target, tmp_path
):
    config_file = tmp_path / "plain.json"
    config_file.write_text(json.dumps(_plain(files.config)))
    profile = read_profile(files.profile)
    with pytest.raises(HarnessError, match=r"describe different drafters \(dflash2: "):
        load_drafter(files.checkpoint, target.shape, config_file=config_file, profile=profile)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda c: c["dflash_config"].pop("selector_top_k"), "without selector_top_k"),
        (lambda c: c.update(architectures=["DFlashDraftModel"]), "states DFlash-2 keys but"),
        (lambda c: c["dflash_config"].update(conv_group_size=24), "does not divide hidden_size"),
        (lambda c: c.update(vocab_size=50), r"vocab_size 50 \(rows of the selector's codebooks"),
    ],
)
def test_a_bad_dflash2_config_stops_by_name(files, target, tmp_path, edit, expected):
    config = json.loads(json.dumps(files.config))
    edit(config)
    directory = save_hf_dir(tmp_path / "bad", config, hf_names(files.weights))
    with pytest.raises(HarnessError, match=expected):
        load_drafter(directory, target.shape)


def test_exporting_a_dflash2_drafter_is_refused_in_one_line_and_writes_nothing(
    lab, files, tmp_path
):
    from dflash_eval.run.export import ExportOptions, export_drafter

    out = tmp_path / "drafter"
    with pytest.raises(HarnessError) as refused:
        export_drafter(ExportOptions(files.hf_dir, lab.target_dir, out))
    assert "DFlash-2" in str(refused.value) and "SGLang" in str(refused.value)
    assert "\n" not in str(refused.value) and not out.exists()
    assert list(tmp_path.iterdir()) == []  # no partial directory either
