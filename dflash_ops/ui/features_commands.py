"""`fab extract-features`'s front door: choose the set's inputs from the flags and the
inventory, compute it on the features host (live progress), relay it to the eval hosts
(transfer bars), and say how to use it.
"""

from __future__ import annotations

from pathlib import Path

from dflash_ops.core.arguments import parse_choice, parse_count
from dflash_ops.core.errors import OpsError
from dflash_ops.core.inventory import Inventory
from dflash_ops.evaluation.harness_options import DTYPES
from dflash_ops.evaluation.jobs import Detached
from dflash_ops.evaluation.run import dataset_prompts
from dflash_ops.features.extract import FeatureSet, extract_features
from dflash_ops.features.relay import RelayOptions, relay_set
from dflash_ops.features.spec import DEFAULT_MAX_NEW_TOKENS, FeatureRequest, choose_layers
from dflash_ops.ui.console import console
from dflash_ops.ui.eval_view import LiveView

PROMPT_SETS_DIR = "prompt-sets"  # under the results directory, as run-eval's
DEVICES = ("auto", "cpu", "cuda")


def extract_features_command(
    inventory: Inventory,
    *,
    on: str | None,
    prompts: str | None,
    dataset: str | None,
    num_prompts: object,
    max_new_tokens: object,
    layers: str | None,
    block_size: object,
    thinking: str | None,
    target_dtype: str | None,
    device: str | None,
    sglang: bool,
    threads: object,
    to: str | None,
    verify: bool,
) -> FeatureSet:
    """`fab extract-features`: the set for these inputs on the features host, then on every
    eval host named by `to` (default: all)."""
    targets = [name.strip() for name in to.split(",") if name.strip()] if to else None
    for name in targets or []:
        inventory.eval_host(name)  # a typo fails before an hour of extraction
    layer_ids, block = choose_layers(inventory, layers, parse_count("--block-size", block_size, 2))
    request = FeatureRequest(
        layers=layer_ids,
        block_size=block,
        max_new_tokens=parse_count("--max-new-tokens", max_new_tokens, 1) or DEFAULT_MAX_NEW_TOKENS,
        thinking=parse_choice("--thinking", thinking or "off", ("on", "off")) == "on",
        prompts=_prompts_file(inventory, prompts, dataset, num_prompts),
        target_dtype=parse_choice("--target-dtype", target_dtype, ("auto", *DTYPES))
        if target_dtype
        else None,
        device=parse_choice("--device", device, DEVICES) if device else None,
        sglang=sglang,
        threads=parse_count("--threads", threads, 1),
    )
    view = LiveView()
    try:
        found = extract_features(inventory, on, request, view)
    except Detached as detached:
        console.print(
            f"\n[yellow]detached[/]: run {detached.run_id} goes on on {detached.host}. "
            f"Follow it: fab eval-logs --id {detached.run_id} --follow; then run this "
            "extract-features again to relay the set"
        )
        raise SystemExit(130) from None
    console.print(describe_set(found))
    with view.transfers() as progress_factory:
        options = RelayOptions(verify, console.print, progress_factory)
        relay_set(inventory, found, targets or list(inventory.eval_hosts), options)
    console.print(f"use it: fab run-eval --features {found.set_id} …")
    return found


def _prompts_file(
    inventory: Inventory, prompts: str | None, dataset: str | None, num_prompts: object
) -> Path | None:
    if dataset:
        if prompts:
            raise OpsError("--dataset and --prompts both name the prompts: pass one of them")
        per_set = parse_count("--num-prompts", num_prompts, 1)
        directory = inventory.local.results / PROMPT_SETS_DIR
        return dataset_prompts(dataset, per_set, directory, console.print)
    if num_prompts is not None:
        raise OpsError(
            "--num-prompts draws from each --dataset set; with --prompts FILE or the built-in "
            "prompts the set holds them all (run-eval --num-prompts N uses the first N)"
        )
    if prompts and not Path(prompts).is_file():
        raise OpsError(f"--prompts: {prompts} is not a file on this workstation")
    return Path(prompts) if prompts else None


def describe_set(found: FeatureSet) -> str:
    """One line on what the set holds and how it was computed."""
    record = found.record
    provenance = record.get("provenance") or {}
    kernel = provenance.get("kernel") or {}
    kernels = ", ".join(f"{k} {v}" for k, v in kernel.items()) if isinstance(kernel, dict) else ""
    how = ", ".join(
        str(part) for part in (provenance.get("device"), provenance.get("dtype"), kernels) if part
    )
    state = "computed" if found.computed else "found"
    return (
        f"[green]feature set {found.set_id}[/] {state} on {found.host}: "
        f"{record.get('entries', '?')} entries, layers {record.get('layer_ids')}, block size "
        f"{record.get('block_size')}, {record.get('max_new_tokens')} new tokens ({how})"
    )
