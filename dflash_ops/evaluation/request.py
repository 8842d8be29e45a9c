"""What one evaluation asks for: the `EvalRequest` behind `fab run-eval`'s (and `fab watch`'s)
flags, with its harness argv checked and its prompts file built (--prompts, or --dataset sets
drawn on the workstation) before anything is staged or launched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

from dflash_ops.core.arguments import parse_choice
from dflash_ops.core.errors import HostError, OpsError
from dflash_ops.core.inventory import EvalHost, HarnessHost, Inventory
from dflash_ops.core.records import check_json_lines
from dflash_ops.core.text import check_tag
from dflash_ops.evaluation.dataset_cache import load_set
from dflash_ops.evaluation.datasets import parse_sets, prompt_records, write_prompts
from dflash_ops.evaluation.harness_options import checked, harness_args
from dflash_ops.evaluation.tracking import require_wandb
from dflash_ops.staging.sources import Via


@dataclass
class EvalRequest:
    step: int
    host: str | None = None
    harness_args: list[str] = field(default_factory=list)  # passed through to the harness
    prompts: Path | None = None  # a local JSONL file, uploaded into the run directory
    drafter_config: Path | None = None  # a local config.json, uploaded likewise
    reference: bool = False  # also evaluate the inventory's reference_drafter
    completions: str | None = None  # --completions: sglang, local, or None (sglang_url's)
    sampled: bool = False  # T > 0: the target samples its own completions, never SGLang
    strip_optimizer: bool = False
    tag: str | None = None
    detach: bool = False
    via: str = "stream"  # how staging reads the trainer's file (stage-checkpoint --via/--pull)
    features: str | None = None  # a relayed feature set's id, or 'latest' (extract-features)
    wandb: str | None = None  # a W&B project each pulled run is logged to (tracking.py)


# build_request's keywords that `fab run-eval` and `fab watch` take from their command line
# as they are, beside the harness's own options, each unset (ui.fab_help.REQUEST_FLAGS).
REQUEST_OPTIONS: dict[str, object] = {
    "prompts": None,
    "dataset": None,
    "drafter_config": None,
    "reference": False,
    "strip_optimizer": False,
    "tag": None,
    "via": "stream",
    "wandb": None,
}


def request_options(
    harness_options: Mapping[str, object], chosen: Mapping[str, object]
) -> dict[str, object]:
    """build_request's keywords from a task's harness options and its REQUEST_OPTIONS."""
    return {"harness_options": dict(harness_options), **chosen}


def build_request(
    *,
    step: int,
    host: str | None,
    harness_options: dict[str, object],
    prompts: str | None,
    drafter_config: str | None = None,
    dataset: str | None = None,
    prompt_sets_dir: Path | None = None,
    reference: bool = False,
    strip_optimizer: bool = False,
    tag: str | None = None,
    detach: bool = False,
    via: str = "stream",
    features: str | None = None,
    wandb: str | None = None,
    say: Callable[[str], None] = lambda message: None,
) -> EvalRequest:
    """The request behind `fab run-eval`'s flags. `harness_options` are the harness's own
    options by run-eval's names (the table's, for_task(RUN_EVAL)); unset ones are not passed.

    `dataset` names prompt sets (dflash_ops.evaluation.datasets): they are built here, into
    a prompts file in `prompt_sets_dir` that is uploaded like --prompts, and num_prompts
    becomes the number of prompts drawn from each set."""
    per_set = None
    if dataset:  # --num-prompts is drawn from each set, not passed on to cut the file again
        harness_options = dict(harness_options)
        per_set = harness_options.pop("num_prompts", None)
    prompts_path = prompts_file(
        prompts, dataset, per_set, prompt_sets_dir or Path("prompt-sets"), say
    )
    if wandb:
        require_wandb(wandb)
    if drafter_config and not Path(drafter_config).is_file():
        raise OpsError(f"--drafter-config: {drafter_config} is not a file on this workstation")
    options = checked(harness_options)
    return EvalRequest(
        step=step,
        host=host,
        harness_args=harness_args(harness_options),
        drafter_config=Path(drafter_config) if drafter_config else None,
        reference=reference,
        prompts=prompts_path,
        completions=options.get("completions"),
        sampled=bool(options.get("temperature")),
        strip_optimizer=strip_optimizer,
        tag=check_tag(tag),
        detach=detach,
        via=parse_choice("--via", via, get_args(Via)),
        features=features or None,
        wandb=wandb or None,
    )


def sglang_url(request: EvalRequest, name: str, entry: EvalHost) -> str | None:
    """The SGLang server the run's completions come from; None: the target decodes them on
    the host. As `completions_server` says, except that by default the target samples them
    itself (T > 0) and a feature set brings its own."""
    if request.completions is None and (request.sampled or request.features is not None):
        return None
    return completions_server(request.completions, name, entry)


def completions_server(completions: str | None, name: str, entry: HarnessHost) -> str | None:
    """The SGLang server greedy completions come from on host `name` (None: the target
    decodes them there): by default the inventory's `sglang_url`; --completions local opts
    out, --completions sglang insists."""
    if completions == "local":
        return None
    if completions == "sglang" and not entry.sglang_url:
        raise HostError(
            name,
            "--completions sglang needs `sglang_url` for this host in the inventory "
            "(or pass --completions local)",
        )
    return entry.sglang_url


def prompts_file(
    prompts: str | None,
    dataset: str | None,
    num_prompts: object,
    directory: Path,
    say: Callable[[str], None],
) -> Path | None:
    """The prompts to upload (run-eval's and extract-features' --prompts/--dataset): the file
    `prompts`, or one built in `directory` of the `dataset` sets with `num_prompts` drawn
    from each (all when None); None: neither, the harness's built-in prompts."""
    if dataset:
        if prompts:
            raise OpsError("--dataset and --prompts both name the prompts: pass one of them")
        per_set = checked({"num_prompts": num_prompts}).get("num_prompts")  # the table's
        return dataset_prompts(dataset, per_set, directory, say)
    if not prompts:
        return None
    if not Path(prompts).is_file():
        raise OpsError(f"--prompts: {prompts} is not a file on this workstation")
    check_json_lines(Path(prompts), "--prompts")  # here, before anything is staged or sent
    return Path(prompts)


def dataset_prompts(
    sets: str, per_set: int | None, directory: Path, say: Callable[[str], None]
) -> Path:
    """The prompts file of the named sets (`gsm8k,mt-bench`, `gsm8k=PATH`), `per_set` rows
    of each (all when None)."""
    records = []
    for request in parse_sets(sets):
        loaded = load_set(request, say=say)
        chosen = prompt_records(loaded, per_set)
        say(f"{loaded.spec.name}: {len(chosen)} of {len(loaded.rows)} rows")
        records += chosen
    path = write_prompts(records, directory)
    say(f"prompts: {len(records)} from {sets} → {path}")
    return path


def run_flag(inventory: Inventory) -> str:
    """` --run NAME` for the hints of a named training run's commands ('' for the default)."""
    return f" --run {inventory.training_run}" if inventory.training_run else ""
