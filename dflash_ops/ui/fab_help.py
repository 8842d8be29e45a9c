"""The help of the fab tasks' flags that are not harness options (those come with their help
from the harness's option table: ui.task.harness_flags), and the flags run-eval and watch
share (REQUEST_FLAGS), kept here so that fabfile.py holds the tasks themselves."""

from __future__ import annotations

from dflash_eval.contract.numbers import span

from dflash_ops.core.arguments import MAX_COUNT, MAX_RETRIES
from dflash_ops.evaluation.request import REQUEST_OPTIONS
from dflash_ops.ui.output import FORMAT_HELP
from dflash_ops.ui.task import FlagGroup

RUN_HELP = (
    "training run (the trainer's `runs` in the inventory); default: the trainer's own "
    "checkpoints, else its only run"
)

BWLIMIT_HELP = (
    "bytes per second a transfer may move, e.g. 200m (= 200 MiB/s); 'none' for no limit "
    "(default: the inventory's transfer.bwlimit)"
)

# `--id`, not `--run`: on the other tasks `--run` names a training run.
RUN_ID_HELP = (
    "run id, its short id or any unique part of it (fab eval-status lists them; default: the "
    "running run, else the newest)"
)


STAGE_HELP = {
    "step": "training step to stage",
    "latest": "stage the latest complete checkpoint",
    "to": "eval host(s), comma-separated (default: every eval host)",
    "dry_run": "print the plan (route, bytes, free space per hop, resume offset); write nothing",
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


PRUNE_HELP = {
    "host": "only this eval (or, with --features, features) host (default: every eval host "
    "and local.staging)",
    "keep_last": f"keep the newest N steps of each training run; {span(0, MAX_COUNT)} (default 2)",
    "keep_steps": "also keep these steps, comma-separated",
    "yes": "really remove (default: show what would go)",
    "dry_run": "show what would go, remove nothing (the default without --yes)",
    "run": "only this training run's staged steps (default: every run's)",
    "features": "prune feature sets instead, on the features and eval hosts (newest N of "
    "each target kept)",
    "keep_sets": "with --features: also keep these set ids, comma-separated",
}


RUN_EVAL_HELP = {
    "step": "training step to evaluate",
    "latest": "evaluate the trainer's latest complete checkpoint",
    "via": "how staging reads the trainer's file: stream (default), rootfs or pull",
    "pull": "copy the checkpoint out of the container first (same as --via pull)",
    "bwlimit": BWLIMIT_HELP,
    "steps": "several steps, comma-separated: spread over all eval hosts in parallel",
    "all_new": "every complete checkpoint without a successful result yet (a sweep)",
    "host": "eval host (default: the only one, else the first idle one, said with why)",
    "hosts": "run the step on each of these eval hosts at once: 'all' or a comma list of "
    "names (the dry run plans each); not with --host or a sweep",
    "drafter_config": "local DFlash config.json for checkpoints that carry none (uploaded)",
    "reference": "also evaluate the inventory's reference_drafter on the same states",
    "prompts": "local JSONL prompts file (uploaded with the run)",
    "dataset": "named prompt sets, comma-separated: gsm8k, math500, humaneval, mbpp, "
    "mt-bench (as z-lab's benchmark formats them; NAME=FILE reads local data files); "
    "--num-prompts N then draws N from each",
    "strip_optimizer": "evaluate a copy without optimizer state (harness extract)",
    "tag": "a label stored with the run (for compare --tag)",
    "detach": "start the run and return; follow later with eval-logs --follow",
    "run": RUN_HELP,
    "dry_run": "print the plan per eval host (staged or bytes to move, cache hits, what "
    "would be computed, target memory vs available, an estimated time); write nothing",
    "features": "use a relayed feature set (fab extract-features) instead of computing "
    "completions and hidden states on the eval host: its id, or 'latest'",
    "verbose": "the harness's whole summary at the end (default: 3 lines)",
    "wandb": "log each pulled run to this Weights & Biases project, keyed by training step: "
    "τ, the headline metrics and the training metrics (needs the wandb extra; W&B's own "
    "WANDB_* settings apply, e.g. WANDB_MODE=offline)",
    "like": "repeat a pulled run (its id, short id or any unique part): its step, prompts "
    "and every option, with the current harness; flags given beside it override",
}

# run-eval's options of the run's request that `fab watch` passes on to every run alike.
REQUEST_FLAGS = FlagGroup(
    "request_options", REQUEST_OPTIONS, {name: RUN_EVAL_HELP[name] for name in REQUEST_OPTIONS}
)


FEATURES_HELP = {
    "on": "features host to compute on (default: the only one)",
    "prompts": "local JSONL prompts file (default: the harness's built-in prompts)",
    "dataset": RUN_EVAL_HELP["dataset"],
    "num_prompts": "with --dataset: draw N prompts from each set",
    "layers": "target layers to keep, comma-separated, e.g. 1,9,17 (default: the "
    "trainer's drafter profile)",
    "block_size": "block size B the completions are extended by (default: the profile's)",
    "device": "where the target runs there: auto (CUDA when torch sees a GPU), cpu, cuda",
    "to": "eval host(s) to relay the set to, comma-separated (default: every eval host)",
    "verify": "hash every relayed copy again; send again one that no longer matches",
}


TRAIN_METRIC_HELP = (
    "the training metric drawn with τ on one step axis (default: the first the metrics log "
    "names; inventory runs.NAME.metrics)"
)


COMPARE_HELP = {
    "steps": "only these steps, comma-separated",
    "tag": "only runs with this tag",
    "allow_mixed": "also show the other comparability groups' runs, flagged",
    "plots": "also write the PNG plots, into this directory (--plots alone: <results>/plots)",
    "report": "also write the HTML report (<results>/report.html, as `fab report` does)",
    "samples": "also print each run's decoded drafts next to the target's text",
    "run": "only this training run's results (default: every run's, grouped by run)",
    "format": FORMAT_HELP,
    "wide": "every column (default: a compact table that fits the terminal)",
    "group": "compare this comparability group: its number (default 1, the largest; compare "
    "lists them; " + span(1, MAX_COUNT) + ") or its key (k3f9a1b2c, or its first digits)",
    "baseline": "compare the group of this run (its id or any unique part of it)",
    "train_metric": TRAIN_METRIC_HELP,
}


DIAGNOSE_HELP = {
    "step": "the candidate: the training checkpoint of this step (staged if needed)",
    "against": "the drafter to hold it to: 'reference' (the eval host's reference_drafter, "
    "default) or another step",
    "host": "eval host (default: the only one)",
    "num_prompts": "use the first N prompts (more than exist: an error)",
    "format": "text (default) or json: an object whose findings list is ranked",
    "run": RUN_HELP,
    "dry_run": "print what it would stage, the repairs it would try on how many prompts, and "
    "its time estimate; stage, run and write nothing",
}


WATCH_HELP = {
    "run": RUN_HELP,
    "interval": "time between looks at the trainer, e.g. 90s, 10m, 1h; at most a week "
    "(default 10m)",
    "retries": "further attempts of a failed step, one per pass, before it is skipped; "
    f"{span(0, MAX_RETRIES, 'retries')} (default 2)",
    "once": "one pass, then exit (for cron and tests)",
    "max_passes": f"stop after N passes; {span(1, MAX_COUNT, 'passes')} (default: until Ctrl-C)",
    "webhook": "POST JSON news of each step to this URL (default: $DFLASH_WATCH_WEBHOOK)",
    "tag": "a label stored with each run; the watch follows this tag's runs only",
}
