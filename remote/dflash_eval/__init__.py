"""DFlash drafter evaluation harness: runs on the eval host (stdlib + torch, transformers,
safetensors, requests only).

`python -m dflash_eval eval ...` measures acceptance length (τ) of a drafter checkpoint
against a target model by simulating greedy speculative decoding offline (dflash-spec.md §3);
`python -m dflash_eval extract ...` strips a training checkpoint down to its parameters.
"""

from dflash_eval.contract.errors import HarnessError

__all__ = ["HarnessError"]
