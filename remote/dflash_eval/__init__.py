"""DFlash drafter evaluation harness: runs on the eval host (stdlib + torch, transformers,
safetensors, requests only).

`python -m dflash_eval eval ...` measures acceptance length (τ) of a drafter checkpoint
against a target model by simulating greedy speculative decoding offline (dflash-spec.md §3);
`python -m dflash_eval extract ...` strips a training checkpoint down to its parameters.

Packages by concern, lowest first: each imports only from itself and those above it here.

    contract    stdlib only: options, command line, prompts, results types, errors,
                versions; the only part the workstation imports
    target      target config, loading, placement, kernels, feature dtype and fidelity
    drafter     drafter config, models, checkpoints, settings, loading
    walk        the τ maths: predictions, acceptance walks, sampling, intervals
    reference   reference completions and hidden states: cache, feature sets, SGLang
    run         the commands that compute and write: eval, features, extract
    plan        the dry run: what an eval would find, compute, need and take
    diagnose    one drafter held against another; ranked findings

cli.py, above them all, hands each command to the package that runs it.
"""

from dflash_eval.contract.errors import HarnessError

__all__ = ["HarnessError"]
