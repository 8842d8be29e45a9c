"""A run's sampling settings (T > 0 or greedy), checked once: stdlib only, so that what decides
a run (run/prepared.py, the dry run) has them without loading torch. The maths that samples
with them is sampling.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_eval.contract import options as run_options
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.option_rules import check_together

REFERENCE_COMMIT = "z-lab/dflash 10129599dffb338ff38cfd235a53ca6d3667b4dd"
PROCESSING = "temperature, then top-k, then top-p (as z-lab's _sampling_probs)"


@dataclass(frozen=True)
class Sampling:
    """How both models sample. temperature 0: greedy (the other fields are unused)."""

    temperature: float = run_options.default("temperature")
    top_p: float = run_options.default("top_p")
    top_k: int = run_options.default("top_k")
    seed: int = run_options.default("seed")
    samples: int = run_options.default("samples")  # walks per prompt
    paths: int = run_options.default("paths")  # sampled completions per prompt

    @property
    def active(self) -> bool:
        return self.temperature > 0

    def check(self) -> None:
        """Each setting within its bounds in the option table (for settings built in code,
        not parsed by argparse), and the table's rules between them (contract/options.py)."""
        run_options.check(self)
        check_together({"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k})

    def key(self, path: int = 0) -> dict[str, Any]:
        """What a prompt's sampled completion number `path` depends on (part of its cache
        key; the first path's key is the one of runs before --paths, so their entries stay)."""
        key = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
        }
        return {**key, "path": path} if path else key

    def record(self) -> dict[str, Any]:
        return {
            **self.key(),
            "samples": self.samples,
            "paths": self.paths,
            "processing": PROCESSING,
            "reference": REFERENCE_COMMIT,
        }


def from_options(options: Any) -> Sampling:
    """The run's sampling settings (run/options.py's EvalOptions fields), checked: at T > 0 the
    target's own probability of each completion token is needed, so the completion is
    sampled here, never taken from SGLang or a feature set (which hold greedy ones)."""
    sampling = Sampling(
        options.temperature,
        options.top_p,
        options.top_k,
        options.seed,
        options.samples,
        options.paths,
    )
    sampling.check()
    if sampling.active and options.sglang_url:
        raise HarnessError(
            f"--temperature {sampling.temperature} samples each completion locally with the "
            "target (the acceptance ratios need its probability of every token); omit "
            "--sglang-url."
        )
    if sampling.active and getattr(options, "features", None):
        raise HarnessError(
            f"--temperature {sampling.temperature}: feature set {options.features} holds greedy "
            "completions; omit --features to sample completions with the target."
        )
    return sampling


def refuse_dflash2(sampling: Sampling, dflash2: list[Path]) -> None:
    """T > 0 is measured for plain DFlash drafters only (`dflash2`: the run's DFlash-2 ones):
    a DFlash-2 selector's distribution for slot k depends on its choice at slot k − 1, which
    the acceptance argument of docs/sampling.md does not cover."""
    if sampling.active and dflash2:
        raise HarnessError(
            f"--temperature {sampling.temperature}: {dflash2[0]} is a DFlash-2 drafter, whose "
            "slots are chosen one after another, and T > 0 is evaluated for plain DFlash "
            "drafters only (docs/sampling.md); evaluate it at --temperature 0."
        )
