"""dflash-ops: stage DFlash drafter checkpoints from the trainer to eval hosts and evaluate them.

Tasks are thin: they parse arguments and call into the `dflash_ops` library. `fab --list` shows
them; `fab --help TASK` documents every flag. `dflash-ops TASK` runs them from any directory
(dflash_ops.ui.program); the lab's tasks are `dflash-lab`'s (dflash_lab.tasks).
"""

from __future__ import annotations

from pathlib import Path

from dflash_eval.contract.options import DIAGNOSE, EXTRACT_FEATURES, RUN_EVAL, WATCH

from dflash_ops.core.arguments import (
    MAX_COUNT,
    MAX_RETRIES,
    one_of,
    parse_count,
    parse_step,
)
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.core.inventory import with_bwlimit
from dflash_ops.evaluation.harness_options import harness_args
from dflash_ops.ui.fab_help import (
    COMPARE_HELP,
    DIAGNOSE_HELP,
    FEATURES_HELP,
    PRUNE_HELP,
    REQUEST_FLAGS,
    RUN_EVAL_HELP,
    RUN_HELP,
    RUN_ID_HELP,
    STAGE_HELP,
    TRAIN_METRIC_HELP,
    WATCH_HELP,
)
from dflash_ops.ui.host_tasks import check_hosts, deploy_harness, setup_eval_host  # noqa: F401
from dflash_ops.ui.output import FORMAT_HELP
from dflash_ops.ui.served_tasks import export_drafter, served_eval  # noqa: F401
from dflash_ops.ui.task import harness_flags, ops_task


@ops_task(help={"run": RUN_HELP, "format": FORMAT_HELP, "wide": "every column, however wide"})
def list_checkpoints(c, inventory=None, run=None, format="table", wide=False):
    """List the trainer's checkpoints: size, mtime, completeness, staged on each eval host."""
    from dflash_ops.ui.staging_view import show_checkpoints

    show_checkpoints(load_inventory(inventory).for_run(run), format, wide)


@ops_task(help=STAGE_HELP)
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

    step = parse_step(step)
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


@ops_task(help=PRUNE_HELP)
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
    dry_run=False,
):
    """Remove old staged checkpoints (--features: feature sets) by policy; dry run by default."""
    from dflash_ops.ui.prune_view import run_prune

    one_of(("--yes", yes), ("--dry-run", dry_run))
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


@ops_task(help=RUN_EVAL_HELP, groups=(harness_flags(RUN_EVAL), REQUEST_FLAGS))
def run_eval(
    c,
    step=None,
    latest=False,
    pull=False,
    bwlimit=None,
    steps=None,
    all_new=False,
    host=None,
    hosts=None,
    detach=False,
    dry_run=False,
    features=None,
    like=None,
    inventory=None,
    run=None,
    verbose=False,
    harness_options=None,
    request_options=None,
):
    """Stage, run the harness detached on the eval host, stream progress, pull results."""
    from dflash_ops.evaluation.request import request_options as request
    from dflash_ops.ui.eval_commands import like_command, run_eval_command

    options = request(harness_options, request_options)
    if pull:
        options["via"] = "pull"
    both = {"detach": detach, "dry_run": dry_run, "verbose": verbose, "host": host, "hosts": hosts}
    if like:
        return like_command(
            with_bwlimit(load_inventory(inventory), bwlimit),
            like,
            run=run,
            step=parse_step(step),
            options=options,
            features=features,
            refused={"--steps": steps, "--latest": latest, "--all-new": all_new},
            **both,
        )
    run_eval_command(
        with_bwlimit(load_inventory(inventory).for_run(run), bwlimit),
        step=parse_step(step),
        steps=steps,
        all_new=all_new,
        options=options,
        latest=latest,
        features=features,
        **both,
    )


@ops_task(help=FEATURES_HELP, groups=(harness_flags(EXTRACT_FEATURES),))
def extract_features(
    c,
    on=None,
    prompts=None,
    dataset=None,
    layers=None,
    device=None,
    to=None,
    verify=False,
    inventory=None,
    harness_options=None,
):
    """Compute the target's completions and hidden states on the features host; relay them."""
    from dflash_ops.ui.features_commands import extract_features_command

    extract_features_command(
        load_inventory(inventory),
        on=on,
        prompts=prompts,
        dataset=dataset,
        harness_options=harness_options,
        layers=layers,
        device=device,
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


@ops_task(help={"format": FORMAT_HELP, "wide": "every column, however wide"})
def eval_status(c, inventory=None, format="table", wide=False):
    """All runs on all eval hosts, newest first: state, progress or τ, start, duration."""
    from dflash_ops.ui.eval_commands import show_status

    show_status(load_inventory(inventory), format, wide)


@ops_task(help={"id": RUN_ID_HELP, "follow": "keep printing until the run ends"})
def eval_logs(c, id=None, follow=False, inventory=None):
    """Print a run's log (the harness's stderr); --follow streams it until the run ends."""
    from dflash_ops.ui.eval_commands import show_logs

    show_logs(load_inventory(inventory), id, follow)


@ops_task(help={"id": RUN_ID_HELP})
def eval_cancel(c, id=None, inventory=None):
    """Stop a running evaluation (SIGTERM to the harness); its files stay on the host."""
    from dflash_ops.ui.eval_commands import cancel_run

    cancel_run(load_inventory(inventory), id)


@ops_task()
def fetch_results(c, inventory=None):
    """Pull every finished run not pulled yet into local.results/<run-id>/."""
    from dflash_ops.ui.eval_commands import fetch_all

    fetch_all(load_inventory(inventory))


@ops_task(help=COMPARE_HELP, optional=["plots"])
def compare(
    c,
    steps=None,
    tag=None,
    allow_mixed=False,
    plots=None,
    samples=False,
    inventory=None,
    run=None,
    format="table",
    wide=False,
    group=None,
    baseline=None,
    train_metric=None,
    report=False,
):
    """Table of τ (95 % intervals), DDTree τ and acceptance across steps (--plots, --report)."""
    from dflash_ops.ui.compare_commands import show_comparison

    inv = load_inventory(inventory)
    show_comparison(
        inv.local.results,
        steps,
        tag,
        allow_mixed,
        inv.local.results / "plots" if plots is True else Path(plots) if plots else None,
        samples,
        inv.require_run(run),
        fmt=format,
        wide=wide,
        group=group,
        baseline=baseline,
        train_metric=train_metric,
        with_report=report,
    )


@ops_task(
    help={
        "out": "CSV or JSON file, by its suffix (default: <results>/export.csv)",
        "steps": "only these steps, comma-separated",
        "tag": "only runs with this tag",
        "run": "only this training run's results",
    }
)
def export(c, out=None, steps=None, tag=None, inventory=None, run=None):
    """Write the results as one tidy table: a row per run × prompt set × metric (pandas-ready)."""
    from dflash_ops.ui.compare_commands import export_results

    inv = load_inventory(inventory)
    export_results(inv.local.results, Path(out) if out else None, steps, tag, inv.require_run(run))


@ops_task(help={"project": "the W&B project to send to (as --wandb PROJECT of run-eval)"})
def wandb_sync(c, project=None, inventory=None):
    """Send pulled results not yet sent to Weights & Biases (a second sync sends nothing)."""
    from dflash_ops.ui.tracking_commands import wandb_sync as sync_pulled

    sync_pulled(load_inventory(inventory).local.results, project)


@ops_task(
    help={
        "steps": "only these steps, comma-separated",
        "tag": "only runs with this tag",
        "out": "where to write the HTML file (default: <results>/report.html)",
        "run": "only this training run's results (default: every run's, grouped by run)",
        "train_metric": TRAIN_METRIC_HELP,
    }
)
def report(c, steps=None, tag=None, out=None, inventory=None, run=None, train_metric=None):
    """One self-contained HTML report: τ vs step with intervals, per-set table, provenance."""
    from dflash_ops.ui.compare_commands import write_report

    inv = load_inventory(inventory)
    out_path = Path(out) if out else None
    write_report(inv.local.results, steps, tag, out_path, inv.require_run(run), train_metric)


@ops_task(help=DIAGNOSE_HELP, groups=(harness_flags(DIAGNOSE),))
def diagnose(
    c,
    step=None,
    against="reference",
    host=None,
    format="text",
    inventory=None,
    run=None,
    dry_run=False,
    harness_options=None,
):
    """Why is this drafter worse? Ranked findings, each with evidence and what to check next."""
    from dflash_ops.ui.diagnose_view import diagnose_command

    diagnose_command(
        load_inventory(inventory).for_run(run),
        step=parse_step(step),
        against=str(against),
        host=host,
        harness_args=harness_args(harness_options),
        output=format,
        dry_run=dry_run,
    )


@ops_task(help=WATCH_HELP, groups=(harness_flags(WATCH), REQUEST_FLAGS))
def watch(
    c,
    interval="10m",
    retries="2",
    once=False,
    max_passes=None,
    webhook=None,
    inventory=None,
    run=None,
    harness_options=None,
    request_options=None,
):
    """Follow training: evaluate each new complete checkpoint, every --interval, until Ctrl-C."""
    from dflash_ops.evaluation.request import request_options as request
    from dflash_ops.ui.watch_view import watch_command

    watch_command(
        load_inventory(inventory).for_run(run),
        interval=interval,
        retries=parse_count("--retries", retries, minimum=0, maximum=MAX_RETRIES, unit="retries"),
        once=once,
        max_passes=parse_count(
            "--max-passes", max_passes, minimum=1, maximum=MAX_COUNT, unit="passes"
        ),
        webhook=webhook,
        options=request(harness_options, request_options),
    )
