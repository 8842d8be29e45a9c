"""dflash-ops: stage DFlash drafter checkpoints from the trainer to eval hosts and evaluate them.

Tasks are thin: they parse arguments and call into the `dflash_ops` library. `fab --list` shows
them; `fab --help TASK` documents every flag.
"""

from __future__ import annotations

from pathlib import Path

from invoke.exceptions import Exit

from dflash_lab import lab
from dflash_ops.core.arguments import one_of, parse_count
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.core.inventory import with_bwlimit
from dflash_ops.evaluation.harness_options import pick as pick_harness_options
from dflash_ops.provision.harness import deploy_harness_to
from dflash_ops.provision.setup import setup_eval_hosts
from dflash_ops.provision.setup import summary as setup_summary
from dflash_ops.remote import checks
from dflash_ops.ui.console import check_table, console
from dflash_ops.ui.output import FORMAT_HELP
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


LAB_DIR_HELP = f"lab directory (default: $DFLASH_LAB_DIR, else {lab.DEFAULT_ROOT})"


@ops_task(
    help={
        "dir": LAB_DIR_HELP,
        "eval_hosts": "how many eval hosts (eval, eval2, …)",
        "content": "'random' (checkpoint files of random bytes) or 'models' (tiny target + "
        "trained drafter checkpoints)",
        "checkpoint_size": "size of each random checkpoint, e.g. 4m or 1.2g",
        "trainer_disk": "size of the trainer's disk (tmpfs)",
        "eval_disk": "size of each eval host's disk (tmpfs)",
        "workstation_disk": "size of the workstation's staging disk (tmpfs)",
        "sudo_hosts": "hosts that log in as a non-root user with `become: sudo`, "
        "comma-separated (root only: the lab makes that user)",
        "features_host": "also a features host (CPU) with the target, for extract-features",
    }
)
def lab_up(
    c,
    dir=None,
    eval_hosts=1,
    content="random",
    checkpoint_size="4m",
    trainer_disk="256m",
    eval_disk="3g",
    workstation_disk="256m",
    sudo_hosts=None,
    features_host=False,
):
    """Build the local lab: sshd hosts in network namespaces, disks, keys, inventory."""
    config = lab.LabConfig(
        root=Path(dir) if dir else lab.DEFAULT_ROOT,
        eval_hosts=eval_hosts,
        content=content,
        checkpoint_size=checkpoint_size,
        trainer_disk=trainer_disk,
        eval_disk=eval_disk,
        workstation_disk=workstation_disk,
        sudo_hosts=tuple(name.strip() for name in sudo_hosts.split(",")) if sudo_hosts else (),
        features_host=features_host,
    )
    built = lab.up(config, lab.content_generator(content))
    console.print(
        f"lab up at {built.root} ({built.state.mode} mode): {', '.join(built.state.hosts)}"
    )
    console.print(f"export DFLASH_INVENTORY={built.inventory_path}")


@ops_task(help={"dir": LAB_DIR_HELP})
def lab_down(c, dir=None):
    """Remove the lab: processes, mounts, namespaces, links and files."""
    problems = lab.load(Path(dir) if dir else lab.DEFAULT_ROOT).down()
    if problems:
        raise Exit("lab-down left things behind:\n  " + "\n  ".join(problems), code=1)
    console.print("lab removed")


@ops_task(help={"dir": LAB_DIR_HELP})
def lab_status(c, dir=None):
    """Show the lab's hosts, addresses, sshd state and inventory path."""
    current = lab.load(Path(dir) if dir else lab.DEFAULT_ROOT)
    for name, record in current.state.hosts.items():
        state = "sshd running" if current.sshd_running(name) else "sshd STOPPED"
        console.print(f"{name:10} {record.address}:{record.port}  {state}  {record.data_dir}")
    console.print(f"inventory: {current.inventory_path}")


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


@ops_task(help={"run": RUN_HELP, "format": FORMAT_HELP, "wide": "every column, however wide"})
def list_checkpoints(c, inventory=None, run=None, format="table", wide=False):
    """List the trainer's checkpoints: size, mtime, completeness, staged on each eval host."""
    from dflash_ops.ui.staging_view import show_checkpoints

    show_checkpoints(load_inventory(inventory).for_run(run), format, wide)


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
        "dry_run": "show what would go, remove nothing (the default without --yes)",
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
        "num_prompts": "evaluate only the first N prompts",
        "max_new_tokens": "reference completion length",
        "max_blocks": "stop each prompt's walk after this many rounds",
        "block_size": "block size B (default: the checkpoint's own)",
        "ddtree": "DDTree budgets, comma-separated, e.g. 4,8,16,32",
        "threads": "torch CPU threads on the eval host",
        "drafter_config": "local DFlash config.json for checkpoints that carry none (uploaded)",
        "mask_token_id": "the drafter's mask token id (overrides what the checkpoint says)",
        "target_layer_ids": "target layers feeding the drafter, comma-separated, e.g. 1,9,17",
        "accept_default": "confirm default rules, e.g. target_layer_ids,rope (else refused)",
        "dtype": "drafter dtype: float32 or bfloat16, bf16/fp32 accepted (default: the "
        "profile's, else float32)",
        "target_dtype": "target dtype: auto, float32 or bfloat16 (bf16/fp32 accepted)",
        "safe_globals": "pickle globals to allow by name, e.g. argparse,numpy",
        "allow_unsafe_pickle": "unpickle anything (runs code from the file; recorded)",
        "no_cache": "neither read nor write the harness's completion/hidden-state cache",
        "chunk_anchors": "anchors per batched drafter pass",
        "per_block": "one drafter pass per block (the unbatched comparison; slow)",
        "verify": "hash the staged checkpoint on the eval host instead of trusting its manifest",
        "reference": "also evaluate the inventory's reference_drafter on the same states",
        "prompts": "local JSONL prompts file (uploaded with the run)",
        "dataset": "named prompt sets, comma-separated: gsm8k, math500, humaneval, mbpp, "
        "mt-bench (as z-lab's benchmark formats them; NAME=FILE reads local data files); "
        "--num-prompts N then draws N from each",
        "thinking": "'on' or 'off' (default): enable_thinking for chat templates that have it",
        "temperature": "sample at this temperature (default 0: greedy; docs/sampling.md)",
        "top_p": "top-p at T > 0 (default 1: off)",
        "top_k": "top-k at T > 0 (default 0: off)",
        "seed": "seed of the sampled completions and Monte Carlo walks (default 0)",
        "samples": "Monte Carlo walks per prompt at T > 0 (default 1000)",
        "sglang": "reference completions from the inventory's sglang_url",
        "strip_optimizer": "evaluate a copy without optimizer state (harness extract)",
        "tag": "a label stored with the run (for compare --tag)",
        "detach": "start the run and return; follow later with eval-logs --follow",
        "run": RUN_HELP,
        "dry_run": "print the plan per eval host (staged or bytes to move, cache hits, what "
        "would be computed, target memory vs available, an estimated time); write nothing",
        "features": "use a relayed feature set (fab extract-features) instead of computing "
        "completions and hidden states on the eval host: its id, or 'latest'",
        "verbose": "the harness's whole summary at the end (default: 3 lines)",
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
    temperature=None,
    top_p=None,
    top_k=None,
    seed=None,
    samples=None,
    sglang=False,
    strip_optimizer=False,
    tag=None,
    detach=False,
    dry_run=False,
    features=None,
    inventory=None,
    run=None,
    verbose=False,
):
    """Stage, run the harness detached on the eval host, stream progress, pull results."""
    from dflash_ops.evaluation.run import request_options
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
        verbose=verbose,
    )


@ops_task(
    help={
        "on": "features host to compute on (default: the only one)",
        "prompts": "local JSONL prompts file (default: the harness's built-in prompts)",
        **{name: run_eval.help[name] for name in ("dataset", "thinking", "target_dtype")},
        "num_prompts": "with --dataset: draw N prompts from each set",
        "max_new_tokens": "reference completion length (default 256, as run-eval's)",
        "layers": "target layers to keep, comma-separated, e.g. 1,9,17 (default: the "
        "trainer's drafter profile)",
        "block_size": "block size B the completions are extended by (default: the profile's)",
        "device": "where the target runs there: auto (CUDA when torch sees a GPU), cpu, cuda",
        "sglang": "reference completions from the features host's sglang_url",
        "threads": "torch CPU threads on the features host",
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
    from dflash_ops.features.spec import HARNESS_OPTIONS
    from dflash_ops.ui.features_commands import extract_features_command

    extract_features_command(
        load_inventory(inventory),
        on=on,
        prompts=prompts,
        dataset=dataset,
        # run-eval's options, as run-eval's (its --verify is another: picked by name here)
        harness_options=pick_harness_options(locals(), HARNESS_OPTIONS),
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


@ops_task(help={"format": FORMAT_HELP, "wide": "every column, however wide"})
def eval_status(c, inventory=None, format="table", wide=False):
    """All runs on all eval hosts, newest first: state, progress or τ, start, duration."""
    from dflash_ops.ui.eval_commands import show_status

    show_status(load_inventory(inventory), format, wide)


# `--id`, not `--run`: on the other tasks `--run` names a training run.
RUN_ID_HELP = (
    "run id, its short id or any unique part of it (fab eval-status lists them; default: the "
    "running run, else the newest)"
)


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


@ops_task(
    help={
        "steps": "only these steps, comma-separated",
        "tag": "only runs with this tag",
        "allow_mixed": "also show the other comparability groups' runs, flagged",
        "plots": "directory for the PNG plots (default: <results>/plots)",
        "samples": "also print each run's decoded drafts next to the target's text",
        "run": "only this training run's results (default: every run's, grouped by run)",
        "format": FORMAT_HELP,
        "wide": "every column (default: a compact table that fits the terminal)",
        "group": "compare this comparability group (default 1, the largest; compare lists them)",
        "baseline": "compare the group of this run (its id or any unique part of it)",
    }
)
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
        fmt=format,
        wide=wide,
        group=parse_count("--group", group, minimum=1),
        baseline=baseline,
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
    from dflash_ops.ui.eval_commands import export_results

    inv = load_inventory(inventory)
    export_results(inv.local.results, Path(out) if out else None, steps, tag, inv.require_run(run))


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


@ops_task(
    help={
        "step": "the candidate: the training checkpoint of this step (staged if needed)",
        "against": "the drafter to hold it to: 'reference' (the eval host's reference_drafter, "
        "default) or another step",
        "host": "eval host (default: the only one)",
        "num_prompts": "use the first N prompts",
        "max_new_tokens": "completion length (default 256)",
        "probe_prompts": "prompts each probe re-evaluates the candidate on (default 4)",
        "format": "text (default) or json: an object whose findings list is ranked",
        "run": RUN_HELP,
    }
)
def diagnose(
    c,
    step=None,
    against="reference",
    host=None,
    num_prompts=None,
    max_new_tokens=None,
    probe_prompts=None,
    format="text",
    inventory=None,
    run=None,
):
    """Why is this drafter worse? Ranked findings, each with evidence and what to check next."""
    from dflash_ops.ui.diagnose_view import diagnose_command

    flags = {
        "--num-prompts": parse_count("--num-prompts", num_prompts, 1),
        "--max-new-tokens": parse_count("--max-new-tokens", max_new_tokens, 1),
        "--probe-prompts": parse_count("--probe-prompts", probe_prompts, 2),
    }
    diagnose_command(
        load_inventory(inventory).for_run(run),
        step=parse_count("--step", step),
        against=str(against),
        host=host,
        harness_args=[a for k, v in flags.items() if v is not None for a in (k, str(v))],
        output=format,
    )


# run-eval's options that `fab watch` passes on to every run, with run-eval's help.
WATCH_RUN_OPTIONS = (
    "num_prompts", "max_new_tokens", "max_blocks", "block_size", "ddtree", "threads",
    "drafter_config", "mask_token_id", "target_layer_ids", "accept_default", "dtype",
    "target_dtype", "safe_globals", "allow_unsafe_pickle", "no_cache", "chunk_anchors",
    "per_block", "reference", "prompts", "sglang", "strip_optimizer", "via", "tag",
    "dataset", "thinking", "run",
)  # fmt: skip


@ops_task(
    help={
        **{name: run_eval.help[name] for name in WATCH_RUN_OPTIONS},
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
    from dflash_ops.evaluation.run import request_options
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
