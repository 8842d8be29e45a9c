"""What the statistical T > 0 tests share (tests/long/test_sampling_live_mean.py,
test_sampling_unbiased.py and test_sampling_coverage.py): the sampling settings, the lab's
models as the harness and the independent live loop (live_loops.py) each load them, and one
sampled path's exact expectation as the harness computes it. The tests are modules of their
own so that parallel workers run them side by side: each takes a minute or more."""

from __future__ import annotations

import torch
from dflash_eval.drafter.loaders import load_drafter
from dflash_eval.reference.completions import sampled_reference
from dflash_eval.reference.sequence import Sequence
from dflash_eval.target.files import load_tokenizer, stop_token_ids
from dflash_eval.target.model import load_target
from dflash_eval.walk.predict import BorrowedHead, SampledPredictor
from dflash_eval.walk.sampled import Expectation, walk_sequence
from dflash_eval.walk.sampling_settings import Sampling

from .live_drafter import PlainDrafter
from .live_loops import LiveModels, Settings

# The lab target is nearly deterministic at T ≈ 1 (its successor token's logit stands far
# above the rest): a high temperature spreads both models, so that acceptance probabilities
# lie well inside (0, 1) and paths differ between seeds.
SETTINGS = Settings(temperature=8.0, top_p=0.95, top_k=40)
MAX_NEW_TOKENS = 16


def lab_parts(lab):
    model = load_target(lab.target_dir, "float32")
    tokenizer = load_tokenizer(lab.target_dir)
    loaded = load_drafter(lab.checkpoints[6000], model.shape)
    # The live loop's drafter is the plain one (live_drafter.py) over the same weights.
    plain = PlainDrafter(loaded.config.to_hf_dict(), loaded.model.state_dict())
    live = LiveModels(model.model, plain, model.embed_weight, model.head_weight)
    stops = stop_token_ids(lab.target_dir, tokenizer)
    return model, tokenizer, loaded, live, stops


def path_expectation(parts, prompt, prompt_ids: list[int], seed: int) -> Expectation:
    """E[τ | path] (and E[tokens], E[rounds]) along the prompt's path sampled with `seed`,
    computed as the harness computes it: its sampled reference, the target's hidden states,
    the batched predictor and the exact walk."""
    model, _, loaded, live, stops = parts
    config = loaded.config
    sampling = Sampling(SETTINGS.temperature, SETTINGS.top_p, SETTINGS.top_k, seed, 2)
    reference, probs = sampled_reference(
        model.model, prompt_ids, MAX_NEW_TOKENS, config.block_size, stops, sampling
    )
    seq = Sequence(prompt, prompt_ids)
    seq.take_reference(reference, MAX_NEW_TOKENS, stops)
    seq.target_probs = probs
    hidden = model.hidden_features(seq.tokens, list(config.target_layer_ids))
    predictor = SampledPredictor(
        loaded.model,
        BorrowedHead(live.embed, live.head, config.mask_token_id),
        seq.tokens,
        torch.cat([hidden[i] for i in config.target_layer_ids], dim=-1),
        len(prompt_ids),
        config.block_size,
        top_k=1,
        last_anchor=seq.span.limit - 1,
    )
    return walk_sequence(predictor, seq, sampling).main
