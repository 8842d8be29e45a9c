"""A run's decisions, made once before anything heavy loads (PreparedRun): its prompts, greedy
or sampled and with which settings, how many sequences per prompt, the DDTree budgets it
measures, its threads, the device it computes on. `eval`, its dry run (`plan`) and
`diagnose` each start from `prepare` and read these from the value, so none of them decides
them a second time.

Stdlib only: whether CUDA is there is asked of the function the caller hands in (torch's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_eval.contract import options as run_options
from dflash_eval.contract.errors import HarnessError
from dflash_eval.contract.prompts import Prompt, builtin_prompts, read_prompts_jsonl
from dflash_eval.run.options import EvalOptions
from dflash_eval.run.threads import default_threads
from dflash_eval.walk.sampling_settings import Sampling, from_options


@dataclass(frozen=True)
class PreparedRun:
    options: EvalOptions  # its device: the one decided (run_device)
    prompts: list[Prompt]
    sampling: Sampling  # checked against the options it is used with (from_options)
    threads: int  # torch threads: --threads, else one per physical core (run/threads.py)

    @property
    def sampled(self) -> bool:
        return self.sampling.active

    @property
    def paths(self) -> int:
        """Sequences per prompt: its sampled completions at T > 0, else the greedy one."""
        return self.sampling.paths if self.sampled else 1

    @property
    def ddtree_budgets(self) -> list[int]:
        """The DDTree budgets the intervals cover: none at T > 0 (the tree is greedy)."""
        return [] if self.sampled else list(self.options.ddtree)

    def with_ddtree(self, budgets: list[int]) -> PreparedRun:
        """The same run with the DDTree budgets its loaded drafters allow (run/drafters.py's
        ddtree_budgets: the default, none for a DFlash-2 drafter)."""
        return dataclasses.replace(self, options=dataclasses.replace(self.options, ddtree=budgets))

    def record(self) -> dict[str, Any]:
        """The decisions, for the dry run's plan."""
        return {
            "mode": "sampled" if self.sampled else "greedy",
            "sampling": self.sampling.record() if self.sampled else None,
            "paths": self.paths,
            "threads": self.threads,
            "device": self.options.device,
        }


def prepare(options: EvalOptions, cores: int, resolve: Callable[[str], str]) -> PreparedRun:
    """The run's decisions from its options. `cores`: the physical cores it may run on;
    `resolve`: a `--device` as this host honours it (target/device.py's resolve_device)."""
    run_options.check(options)  # before anything is decided from them
    sampling = from_options(options)
    threads = options.threads or default_threads(cores)
    prompts = load_prompts(options.prompts, options.num_prompts)
    device = run_device(options.device, sampling.active, resolve)
    return PreparedRun(dataclasses.replace(options, device=device), prompts, sampling, threads)


def run_device(requested: str | None, sampled: bool, resolve: Callable[[str], str]) -> str:
    """A run's `--device` as this host can honour it (the CPU by default). On CUDA the
    walks are greedy only: the sampled walks draw from CPU generators, whose streams a GPU
    would not repeat."""
    if sampled and requested == "cuda":
        raise HarnessError(
            "--device cuda evaluates greedy runs (--temperature 0) only: the sampled walks "
            "draw from CPU random streams. Use --device cpu for T > 0."
        )
    device = resolve(requested or run_options.DEFAULT_DEVICE)
    return run_options.DEFAULT_DEVICE if sampled else device


def load_prompts(path: Path | None, wanted: int | None) -> list[Prompt]:
    """The prompts of a JSONL file (else the built-in set), the first `wanted` of them."""
    prompts = read_prompts_jsonl(path) if path else builtin_prompts()
    if wanted is not None:
        if wanted > len(prompts):
            source = f"the file {path}" if path else "the built-in set"
            raise HarnessError(
                f"--num-prompts {wanted} asks for more prompts than {source} holds "
                f"({len(prompts)}). Pass --num-prompts {len(prompts)} or less, or a --prompts "
                f"JSONL file with at least {wanted} prompts."
            )
        prompts = prompts[:wanted]
    return prompts
