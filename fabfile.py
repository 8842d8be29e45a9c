"""dflash-ops: stage DFlash drafter checkpoints from the trainer to eval hosts and evaluate them.

Tasks are thin: they parse arguments and call into the `dflash_ops` library. `fab --list` shows
them; `fab --help TASK` documents every flag.
"""

from __future__ import annotations

from pathlib import Path

from invoke.exceptions import Exit

from dflash_lab import lab
from dflash_ops import provision
from dflash_ops.core.inventory import load as load_inventory
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
        "host": "eval host to set up (default: every eval host)",
        "force": "delete and recreate the venv even if it is as recorded",
    }
)
def setup_eval_host(c, host=None, force=False, inventory=None):
    """Provision eval hosts: uv, the venv (CPU torch, transformers…), the harness. Idempotent."""
    inv = load_inventory(inventory)
    for outcome in provision.setup_eval_hosts(inv, host, force, say=console.print):
        console.print(provision.summary(outcome))


@ops_task(help={"host": "eval host to deploy to (default: every eval host)"})
def deploy_harness(c, host=None, inventory=None):
    """Upload remote/dflash_eval under its content hash (if new) and make it `current`."""
    inv = load_inventory(inventory)
    for deployed in provision.deploy_harness_to(inv, host, say=console.print):
        console.print(f"{deployed.path} (sha256 {deployed.digest})")


@ops_task()
def list_checkpoints(c, inventory=None):
    """List the trainer's checkpoints: size, mtime, completeness, staged on each eval host."""
    from dflash_ops.ui.staging_view import checkpoints_table

    console.print(checkpoints_table(load_inventory(inventory)))


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
    }
)
def stage_checkpoint(
    c,
    step=0,
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
    inventory=None,
):
    """Copy a checkpoint trainer → workstation → eval host(s): disk-checked, hashed, resumable."""
    from dflash_ops.ui.staging_view import run_stage

    run_stage(
        load_inventory(inventory),
        step=step or None,
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
        "step": "training step to evaluate",
        "steps": "several steps, comma-separated: spread over all eval hosts in parallel",
        "all_new": "every complete checkpoint without a successful result yet (a sweep)",
        "host": "eval host (default: the only one)",
        "num_prompts": "evaluate only the first N prompts",
        "max_new_tokens": "reference completion length",
        "max_blocks": "stop each prompt's walk after this many rounds",
        "block_size": "block size B (default: the checkpoint's own)",
        "ddtree": "DDTree budgets, comma-separated, e.g. 4,8,16,32",
        "threads": "torch CPU threads on the eval host",
        "reference": "also evaluate the inventory's reference_drafter on the same states",
        "prompts": "local JSONL prompts file (uploaded with the run)",
        "sglang": "reference completions from the inventory's sglang_url",
        "strip_optimizer": "evaluate a copy without optimizer state (harness extract)",
        "tag": "a label stored with the run (for compare --tag)",
        "detach": "start the run and return; follow later with eval-logs --follow",
    }
)
def run_eval(
    c,
    step=0,
    steps=None,
    all_new=False,
    host=None,
    num_prompts=0,
    max_new_tokens=0,
    max_blocks=0,
    block_size=0,
    ddtree=None,
    threads=0,
    reference=False,
    prompts=None,
    sglang=False,
    strip_optimizer=False,
    tag=None,
    detach=False,
    inventory=None,
):
    """Stage, run the harness detached on the eval host, stream progress, pull results."""
    from dflash_ops.ui.eval_view import run_eval_command

    run_eval_command(
        load_inventory(inventory),
        step=step,
        steps=steps,
        all_new=all_new,
        host=host,
        harness_flags={
            "--num-prompts": num_prompts,
            "--max-new-tokens": max_new_tokens,
            "--max-blocks": max_blocks,
            "--block-size": block_size,
            "--ddtree": ddtree,
            "--threads": threads,
        },
        reference=reference,
        prompts=prompts,
        sglang=sglang,
        strip_optimizer=strip_optimizer,
        tag=tag,
        detach=detach,
    )


@ops_task()
def eval_status(c, inventory=None):
    """All runs on all eval hosts: state, step, host, start time, duration."""
    from dflash_ops.ui.eval_view import show_status

    show_status(load_inventory(inventory))


@ops_task(
    help={"run": "run id (or a unique prefix of it)", "follow": "keep printing until the run ends"}
)
def eval_logs(c, run, follow=False, inventory=None):
    """Print a run's log (the harness's stderr); --follow streams it until the run ends."""
    from dflash_ops.ui.eval_view import show_logs

    show_logs(load_inventory(inventory), run, follow)


@ops_task(help={"run": "run id (or a unique prefix of it)"})
def eval_cancel(c, run, inventory=None):
    """Stop a running evaluation (SIGTERM to the harness); its files stay on the host."""
    from dflash_ops.ui.eval_view import cancel_run

    cancel_run(load_inventory(inventory), run)


@ops_task()
def fetch_results(c, inventory=None):
    """Pull every finished run not pulled yet into local.results/<run-id>/."""
    from dflash_ops.ui.eval_view import fetch_all

    fetch_all(load_inventory(inventory))


@ops_task(
    help={
        "steps": "only these steps, comma-separated",
        "tag": "only runs with this tag",
        "allow_mixed": "show incomparable runs (flagged) instead of refusing",
        "plots": "directory for the PNG plots (default: <results>/plots)",
    }
)
def compare(c, steps=None, tag=None, allow_mixed=False, plots=None, inventory=None):
    """Table of τ, DDTree τ and acceptance across steps and runs, and PNG plots."""
    from dflash_ops.ui.cli import parse_steps
    from dflash_ops.ui.eval_view import show_comparison

    show_comparison(
        load_inventory(inventory).local.results,
        parse_steps(steps),
        tag,
        allow_mixed,
        Path(plots) if plots else None,
    )
