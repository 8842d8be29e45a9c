"""dflash-ops: stage DFlash drafter checkpoints from the trainer to eval hosts and evaluate them.

Tasks are thin: they parse arguments and call into the `dflash_ops` library. `fab --list` shows
them; `fab --help TASK` documents every flag.
"""

from __future__ import annotations

from pathlib import Path

from dflash_eval.options import EXTRACT_FEATURES, RUN_EVAL, WATCH
from invoke.exceptions import Exit

# The lab's tasks (lab-up, lab-down, lab-status): fab collects the tasks of this module.
from dflash_lab.tasks import lab_down, lab_status, lab_up  # noqa: F401
from dflash_ops.core.arguments import parse_count
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.core.inventory import with_bwlimit
from dflash_ops.evaluation.harness_options import FEATURES_OPTIONS, task_help
from dflash_ops.evaluation.harness_options import pick as pick_harness_options
from dflash_ops.provision.harness import deploy_harness_to
from dflash_ops.provision.setup import setup_eval_hosts
from dflash_ops.provision.setup import summary as setup_summary
from dflash_ops.remote import checks
from dflash_ops.ui.console import check_table, console
from dflash_ops.ui.task import ops_task


@ops_task()
def check_hosts(c, inventory=None):
    """Check every inventory host: SSH, host key, container, directories, disk, tools."""
    inv = load_inventory(inventory)
    rows = checks.check_inventory(inv)
    console.print(check_table(rows, f"check-hosts ({inv.path})"))
    bad = checks.failed(rows)
    if bad:
        raise Exit(
            f"{len(bad)} required check(s) failed: "
            + "; ".join(f"{r.host} {r.check}" for r in bad),
            code=1,
        )
    console.print("[green]all required checks passed[/]")


@ops_task(
    help={
        "host": "eval or features host to set up (default: every eval and features host)",
        "force": "delete and recreate the venv even if it is as recorded",
    }
)
def setup_eval_host(c, host=None, force=False, inventory=None):
    """Provision eval (and features) hosts: uv, the venv (torch, transformers…), the harness."""
    inv = load_inventory(inventory)
    for outcome in setup_eval_hosts(inv, host, force, say=console.print):
        console.print(setup_summary(outcome))


@ops_task(help={"host": "eval host to deploy to (default: every eval host)"})
def deploy_harness(c, host=None, inventory=None):
    """Upload remote/dflash_eval under its content hash (if new) and make it `current`."""
    inv = load_inventory(inventory)
    for deployed in deploy_harness_to(inv, host, say=console.print):
        console.print(f"{deployed.path} (sha256 {deployed.digest})")


RUN_HELP = (
    "training run (the trainer's `runs` in the inventory); default: the trainer's own "
    "checkpoints, else its only run"
)


@ops_task(help={"run": RUN_HELP})
def list_checkpoints(c, inventory=None, run=None):
    """List the trainer's checkpoints: size, mtime, completeness, staged on each eval host."""
    from dflash_ops.ui.staging_view import checkpoints_table

    console.print(checkpoints_table(load_inventory(inventory).for_run(run)))


BWLIMIT_HELP = (
    "bytes per second a transfer may move, e.g. 200m (= 200 MiB/s); 'none' for no limit "
    "(default: the inventory's transfer.bwlimit)"
)


@ops_task(
    help={
        "step": "training step to stage",
        "latest": "stage the latest complete checkpoint",
        "to": "eval host(s), comma-separated (default: every eval host)",
        "dry_run": "print the plan (route, bytes, free space per hop, resume offset); "
        "write nothing",
        "pull": "pct only: `pct pull` to the trainer's tmp_dir first, then send from there",
        "via": "how to read the trainer's file: 'stream' (pct/docker exec, default) or "
        "'rootfs' (the container's host-side rootfs path)",
        "two_hop": "keep a verified copy in local.staging and send from it (fan-out reads "
        "the trainer once)",
        "no_resume": "ignore an existing .partial and start over",
        "verify": "recompute sha256 on both ends even when already staged",
        "margin": "free space to keep beyond the bytes written, e.g. 2g (default: the "
        "inventory's transfer.margin / margin_fraction)",
        "weights_only": "move only the drafter weights: extracted on the trainer with its own "
        "python/torch (or a directory's weight files); the whole file if it cannot",
        "bwlimit": BWLIMIT_HELP,
        "run": RUN_HELP,
    }
)
def stage_checkpoint(
    c,
    step=None,
    latest=False,
    to=None,
    dry_run=False,
    pull=False,
    via="stream",
    two_hop=False,
    no_resume=False,
    verify=False,
    margin=None,
    weights_only=False,
    bwlimit=None,
    inventory=None,
    run=None,
):
    """Copy a checkpoint trainer → workstation → eval host(s): disk-checked, hashed, resumable."""
    from dflash_ops.ui.staging_view import run_stage

    step = parse_count("--step", step)
    run_stage(
        with_bwlimit(load_inventory(inventory).for_run(run), bwlimit),
        step=step,
        latest=latest,
        to=[name.strip() for name in to.split(",")] if to else None,
        dry_run=dry_run,
        via="pull" if pull else via,
        two_hop=two_hop,
        resume=not no_resume,
        verify=verify,
        margin=margin,
        weights_only=weights_only,
    )


@ops_task(
    help={
        "host": "only this eval (or, with --features, features) host (default: every eval host "
        "and local.staging)",
        "keep_last": "keep the newest N steps of each training run (default 2)",
        "keep_steps": "also keep these steps, comma-separated",
        "yes": "really remove (default: show what would go)",
        "run": "only this training run's staged steps (default: every run's)",
        "features": "prune feature sets instead, on the features and eval hosts (newest N of "
        "each target kept)",
        "keep_sets": "with --features: also keep these set ids, comma-separated",
    }
)
def prune(
    c,
    host=None,
    keep_last=None,
    keep_steps=None,
    yes=False,
    inventory=None,
    run=None,
    features=False,
    keep_sets=None,
):
    """Remove old staged checkpoints (--features: feature sets) by policy; dry run by default."""
    from dflash_ops.ui.prune_view import run_prune

    run_prune(
        load_inventory(inventory),
        host=host,
        keep_last=keep_last,
        keep_steps=keep_steps,
        yes=yes,
        run=run,
        features=features,
        keep_sets=keep_sets,
    )


@ops_task(
    help={
        "step": "training step to evaluate",
        "latest": "evaluate the trainer's latest complete checkpoint",
        "via": "how staging reads the trainer's file: stream (default), rootfs or pull",
        "pull": "copy the checkpoint out of the container first (same as --via pull)",
        "bwlimit": BWLIMIT_HELP,
        "steps": "several steps, comma-separated: spread over all eval hosts in parallel",
        "all_new": "every complete checkpoint without a successful result yet (a sweep)",
        "host": "eval host (default: the only one)",
        "drafter_config": "local DFlash config.json for checkpoints that carry none (uploaded)",
        "reference": "also evaluate the inventory's reference_drafter on the same states",
        "prompts": "local JSONL prompts file (uploaded with the run)",
        "dataset": "named prompt sets, comma-separated: gsm8k, math500, humaneval, mbpp, "
        "mt-bench (as z-lab's benchmark formats them; NAME=FILE reads local data files); "
        "--num-prompts N then draws N from each",
        "sglang": "reference completions from the inventory's sglang_url",
        "strip_optimizer": "evaluate a copy without optimizer state (harness extract)",
        "tag": "a label stored with the run (for compare --tag)",
        "detach": "start the run and return; follow later with eval-logs --follow",
        "run": RUN_HELP,
        "dry_run": "print the plan per eval host (staged or bytes to move, cache hits, what "
        "would be computed, target memory vs available, an estimated time); write nothing",
        "features": "use a relayed feature set (fab extract-features) instead of computing "
        "completions and hidden states on the eval host: its id, or 'latest'",
        **task_help(RUN_EVAL),
    }
)
def run_eval(
    c,
    step=None,
    latest=False,
    via="stream",
    pull=False,
    bwlimit=None,
    steps=None,
    all_new=False,
    host=None,
    num_prompts=None,
    max_new_tokens=None,
    max_blocks=None,
    block_size=None,
    ddtree=None,
    threads=None,
    drafter_config=None,
    mask_token_id=None,
    target_layer_ids=None,
    accept_default=None,
    dtype=None,
    target_dtype=None,
    safe_globals=None,
    allow_unsafe_pickle=False,
    no_cache=False,
    chunk_anchors=None,
    per_block=False,
    verify=False,
    reference=False,
    prompts=None,
    dataset=None,
    thinking=None,
    sglang=False,
    strip_optimizer=False,
    tag=None,
    detach=False,
    dry_run=False,
    features=None,
    inventory=None,
    run=None,
):
    """Stage, run the harness detached on the eval host, stream progress, pull results."""
    from dflash_ops.evaluation.request import request_options
    from dflash_ops.ui.eval_commands import run_eval_command

    run_eval_command(
        with_bwlimit(load_inventory(inventory).for_run(run), bwlimit),
        step=parse_count("--step", step) or 0,
        steps=steps,
        all_new=all_new,
        host=host,
        options={**request_options(locals()), "via": "pull" if pull else via},
        latest=latest,
        detach=detach,
        dry_run=dry_run,
        features=features,
    )


@ops_task(
    help={
        "on": "features host to compute on (default: the only one)",
        "prompts": "local JSONL prompts file (default: the harness's built-in prompts)",
        "dataset": run_eval.help["dataset"],
        **task_help(EXTRACT_FEATURES),
        "num_prompts": "with --dataset: draw N prompts from each set",
        "layers": "target layers to keep, comma-separated, e.g. 1,9,17 (default: the "
        "trainer's drafter profile)",
        "block_size": "block size B the completions are extended by (default: the profile's)",
        "device": "where the target runs there: auto (CUDA when torch sees a GPU), cpu, cuda",
        "sglang": "reference completions from the features host's sglang_url",
        "to": "eval host(s) to relay the set to, comma-separated (default: every eval host)",
        "verify": "hash every relayed copy again; send again one that no longer matches",
    }
)
def extract_features(
    c,
    on=None,
    prompts=None,
    dataset=None,
    num_prompts=None,
    max_new_tokens=None,
    layers=None,
    block_size=None,
    thinking=None,
    target_dtype=None,
    device=None,
    sglang=False,
    threads=None,
    to=None,
    verify=False,
    inventory=None,
):
    """Compute the target's completions and hidden states on the features host; relay them."""
    from dflash_ops.ui.features_commands import extract_features_command

    extract_features_command(
        load_inventory(inventory),
        on=on,
        prompts=prompts,
        dataset=dataset,
        # run-eval's options, as run-eval's (its --verify is another: picked by name here)
        harness_options=pick_harness_options(locals(), FEATURES_OPTIONS),
        layers=layers,
        device=device,
        sglang=sglang,
        to=to,
        verify=verify,
    )


@ops_task(
    help={
        "dataset": "prompt sets, comma-separated (gsm8k, math500, humaneval, mbpp, mt-bench); "
        "NAME=FILE reads local data files instead of the hub",
        "refresh": "read the hub again even when the set is cached",
    }
)
def fetch_datasets(c, dataset, refresh=False):
    """Fetch named prompt sets into the workstation's cache (for run-eval --dataset offline)."""
    from dflash_ops.ui.eval_commands import fetch_datasets as fetch

    fetch(dataset, refresh)


@ops_task()
def eval_status(c, inventory=None):
    """All runs on all eval hosts: state, step, host, start time, duration."""
    from dflash_ops.ui.eval_commands import show_status

    show_status(load_inventory(inventory))


# `--id`, not `--run`: on the other tasks `--run` names a training run.
RUN_ID_HELP = "run id or a unique prefix (fab eval-status lists them)"


@ops_task(help={"id": RUN_ID_HELP, "follow": "keep printing until the run ends"})
def eval_logs(c, id, follow=False, inventory=None):
    """Print a run's log (the harness's stderr); --follow streams it until the run ends."""
    from dflash_ops.ui.eval_commands import show_logs

    show_logs(load_inventory(inventory), id, follow)


@ops_task(help={"id": RUN_ID_HELP})
def eval_cancel(c, id, inventory=None):
    """Stop a running evaluation (SIGTERM to the harness); its files stay on the host."""
    from dflash_ops.ui.eval_commands import cancel_run

    cancel_run(load_inventory(inventory), id)


@ops_task()
def fetch_results(c, inventory=None):
    """Pull every finished run not pulled yet into local.results/<run-id>/."""
    from dflash_ops.ui.eval_commands import fetch_all

    fetch_all(load_inventory(inventory))


@ops_task(
    help={
        "steps": "only these steps, comma-separated",
        "tag": "only runs with this tag",
        "allow_mixed": "show incomparable runs (flagged) instead of refusing",
        "plots": "directory for the PNG plots (default: <results>/plots)",
        "samples": "also print each run's decoded drafts next to the target's text",
        "run": "only this training run's results (default: every run's, grouped by run)",
    }
)
def compare(
    c, steps=None, tag=None, allow_mixed=False, plots=None, samples=False, inventory=None, run=None
):
    """Table of τ (with 95 % intervals), DDTree τ and acceptance across steps; plots; report."""
    from dflash_ops.ui.eval_commands import show_comparison

    inv = load_inventory(inventory)
    show_comparison(
        inv.local.results,
        steps,
        tag,
        allow_mixed,
        Path(plots) if plots else None,
        samples,
        inv.require_run(run),
    )


@ops_task(
    help={
        "steps": "only these steps, comma-separated",
        "tag": "only runs with this tag",
        "out": "where to write the HTML file (default: <results>/report.html)",
        "run": "only this training run's results (default: every run's, grouped by run)",
    }
)
def report(c, steps=None, tag=None, out=None, inventory=None, run=None):
    """One self-contained HTML report: τ vs step with intervals, per-set table, provenance."""
    from dflash_ops.ui.eval_commands import write_report

    inv = load_inventory(inventory)
    write_report(inv.local.results, steps, tag, Path(out) if out else None, inv.require_run(run))


# run-eval's own options that `fab watch` passes on to every run, with run-eval's help (the
# harness's options it passes on are the table's: task_help(WATCH)).
WATCH_RUN_OPTIONS = (
    "drafter_config", "reference", "prompts", "sglang", "strip_optimizer", "via", "dataset", "run",
)  # fmt: skip


@ops_task(
    help={
        **{name: run_eval.help[name] for name in WATCH_RUN_OPTIONS},
        **task_help(WATCH),
        "interval": "time between looks at the trainer, e.g. 90s, 10m, 1h (default 10m)",
        "retries": "further attempts of a failed step, one per pass, before it is skipped",
        "once": "one pass, then exit (for cron and tests)",
        "max_passes": "stop after N passes (default: until Ctrl-C)",
        "webhook": "POST JSON news of each step to this URL (default: $DFLASH_WATCH_WEBHOOK)",
        "tag": "a label stored with each run; the watch follows this tag's runs only",
    }
)
def watch(
    c,
    interval="10m",
    retries="2",
    once=False,
    max_passes=None,
    webhook=None,
    tag=None,
    num_prompts=None,
    max_new_tokens=None,
    max_blocks=None,
    block_size=None,
    ddtree=None,
    threads=None,
    drafter_config=None,
    mask_token_id=None,
    target_layer_ids=None,
    accept_default=None,
    dtype=None,
    target_dtype=None,
    safe_globals=None,
    allow_unsafe_pickle=False,
    no_cache=False,
    chunk_anchors=None,
    per_block=False,
    reference=False,
    prompts=None,
    sglang=False,
    strip_optimizer=False,
    via="stream",
    dataset=None,
    thinking=None,
    inventory=None,
    run=None,
):
    """Follow training: evaluate each new complete checkpoint, every --interval, until Ctrl-C."""
    from dflash_ops.evaluation.request import request_options
    from dflash_ops.ui.watch_view import watch_command

    watch_command(
        load_inventory(inventory).for_run(run),
        interval=interval,
        retries=parse_count("--retries", retries),
        once=once,
        max_passes=parse_count("--max-passes", max_passes, minimum=1),
        webhook=webhook,
        options=request_options(locals()),
    )
