"""`fab extract-features`'s front door: choose the set's inputs from the flags and the
inventory, compute it on the features host (live progress), relay it to the eval hosts
(transfer bars), and say how to use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dflash_eval.contract.options import default

from dflash_ops.core.arguments import parse_choice
from dflash_ops.core.errors import OpsError
from dflash_ops.core.inventory import Inventory
from dflash_ops.evaluation.harness_options import checked
from dflash_ops.evaluation.jobs import Detached
from dflash_ops.evaluation.request import completions_server, prompts_file
from dflash_ops.features.extract import FeatureSet, extract_features
from dflash_ops.features.relay import RelayOptions, relay_set
from dflash_ops.features.spec import FeatureRequest, choose_layers
from dflash_ops.ui.console import console, shown
from dflash_ops.ui.eval_commands import PROMPT_SETS_DIR
from dflash_ops.ui.eval_view import LiveView

DEVICES = ("auto", "cpu", "cuda")


def extract_features_command(
    inventory: Inventory,
    *,
    on: str | None,
    prompts: str | None,
    dataset: str | None,
    harness_options: Mapping[str, object],
    layers: str | None,
    device: str | None,
    to: str | None,
    verify: bool,
) -> FeatureSet:
    """`fab extract-features`: the set for these inputs on the features host, then on every
    eval host named by `to` (default: all). `harness_options`: the harness options it takes
    (the table's, for_task(EXTRACT_FEATURES)), by run-eval's names and checked as run-eval's."""
    targets = [name.strip() for name in to.split(",") if name.strip()] if to else None
    for name in targets or []:
        inventory.eval_host(name)  # a typo fails before an hour of extraction
    options = dict(harness_options)
    num_prompts = options.pop("num_prompts", None)  # for the prompts file, not the harness
    chosen = checked(options)
    layer_ids, block = choose_layers(inventory, layers, chosen.get("block_size"))
    prompts_path = _prompts_file(inventory, prompts, dataset, num_prompts)
    # The harness asks the server what it serves before it loads the target (features_run).
    sglang = completions_server(chosen.get("completions"), *inventory.features_host(on))
    request = FeatureRequest(
        layers=layer_ids,
        block_size=block,
        max_new_tokens=chosen.get("max_new_tokens", default("max_new_tokens")),
        thinking=chosen.get("thinking", False),
        prompts=prompts_path,
        target_dtype=chosen.get("target_dtype"),
        device=parse_choice("--device", device, DEVICES) if device else None,
        sglang=sglang is not None,
        threads=chosen.get("threads"),
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
    if num_prompts is not None and not dataset:
        raise OpsError(
            "--num-prompts draws from each --dataset set; with --prompts FILE or the built-in "
            "prompts the set holds them all (run-eval --num-prompts N uses the first N)"
        )
    directory = inventory.local.results / PROMPT_SETS_DIR
    return prompts_file(prompts, dataset, num_prompts, directory, console.print)


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
    # the record is the features host's file: every value of it shown as data
    facts = shown(
        f"{record.get('entries', '?')} entries, layers {record.get('layer_ids')}, block size "
        f"{record.get('block_size')}, {record.get('max_new_tokens')} new tokens ({how})"
    )
    return f"[green]feature set {shown(found.set_id)}[/] {state} on {shown(found.host)}: {facts}"
