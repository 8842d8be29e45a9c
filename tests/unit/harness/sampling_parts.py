"""What the two statistical T > 0 tests share (tests/long/test_sampling_live_mean.py and
test_sampling_unbiased.py): the sampling settings and the lab's models as the harness and the
independent live loop (live_loops.py) each load them. The two tests are modules of their own
so that parallel workers run them side by side: each takes minutes."""

from __future__ import annotations

from dflash_eval.drafter.loaders import load_drafter
from dflash_eval.target.model import load_target, load_tokenizer, stop_token_ids

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
