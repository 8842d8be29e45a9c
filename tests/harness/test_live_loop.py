"""The offline walk's *capped* figure equals a live loop capped at max_new_tokens (T=0, fp32).

The live loop below is written independently of the harness's walk: draft a block, let the
target verify it, accept the agreeing prefix plus the target's bonus token, repeat; its
last round commits only the tokens left. That is the harness's secondary `capped`
convention; test_tau_convention.py checks the main one against z-lab's uncapped loop.
"""

from __future__ import annotations

import torch
from dflash_eval.loaders import load_drafter
from dflash_eval.metrics import Span, walk_prompt
from dflash_eval.predict import BorrowedHead, Predictor
from dflash_eval.target import load_target, load_tokenizer
from transformers import AutoModelForCausalLM

MAX_NEW_TOKENS = 40


@torch.no_grad()
def live_speculative_decoding(model, drafter, embed, head, prompt_ids, max_new_tokens):
    config = drafter.config
    block_size, mask = config.block_size, config.mask_token_id
    tokens = list(prompt_ids)
    tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))  # prefill token
    lengths = []
    while len(tokens) - len(prompt_ids) < max_new_tokens:
        anchor = len(tokens) - 1  # the last committed token
        hidden = model(torch.tensor([tokens[:anchor]]), output_hidden_states=True).hidden_states
        features = torch.cat([hidden[i + 1][0] for i in config.target_layer_ids], dim=-1)
        block = embed[[tokens[anchor]] + [mask] * (block_size - 1)]
        draft_hidden = drafter.forward_uncached(drafter.fuse_context(features), block)
        draft = (draft_hidden[1:] @ head.T).argmax(-1).tolist()
        # The target scores the anchor and the drafts: its prediction after position
        # anchor + j is the token it would emit at anchor + j + 1.
        verify = model(torch.tensor([tokens + draft])).logits[0, anchor:].argmax(-1).tolist()
        accepted = 0
        while accepted < len(draft) and draft[accepted] == verify[accepted]:
            accepted += 1
        committed = [*draft[:accepted], verify[accepted]]
        room = max_new_tokens - (len(tokens) - len(prompt_ids))
        committed = committed[:room]
        tokens += committed
        lengths.append(len(committed))
    return tokens, lengths


def test_offline_walk_equals_live_speculative_decoding(lab):
    model = AutoModelForCausalLM.from_pretrained(str(lab.target_dir), dtype=torch.float32).eval()
    target = load_target(lab.target_dir, "float32")
    tokenizer = load_tokenizer(lab.target_dir)
    loaded = load_drafter(lab.checkpoints[6000], target.shape)
    drafter, config = loaded.model, loaded.config
    embed, head = model.model.embed_tokens.weight.detach(), model.lm_head.weight.detach()
    accepted_any = False
    for prompt in ("def add(a, b): return a + b", "Why is the sky blue?", "x = 1"):
        prompt_ids = tokenizer(prompt)["input_ids"]
        live_tokens, live_lengths = live_speculative_decoding(
            model, drafter, embed, head, prompt_ids, MAX_NEW_TOKENS
        )
        completion = target.greedy(prompt_ids, MAX_NEW_TOKENS, [])
        tokens = prompt_ids + completion
        assert tokens == live_tokens  # speculative decoding at T=0 reproduces greedy
        hidden = target.hidden_features(tokens, list(config.target_layer_ids))
        features = torch.cat([hidden[i] for i in config.target_layer_ids], dim=-1)
        predictor = Predictor(
            drafter,
            BorrowedHead(embed, head, config.mask_token_id),
            tokens,
            features,
            len(prompt_ids),
            config.block_size,
            top_k=1,
        )
        span = Span(len(prompt_ids), len(tokens))
        offline = walk_prompt(predictor, tokens, span, config.block_size)
        assert offline.capped_lengths == live_lengths
        accepted_any |= max(live_lengths) > 1
    assert accepted_any, "the trained lab drafter should get some drafts accepted"
